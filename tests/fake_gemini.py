"""A small fake of the Gemini API (``generativelanguage``) on a free loopback port, for driving Gemini
CLI offline: ``GOOGLE_GEMINI_BASE_URL=api.base_url`` and a dummy ``GEMINI_API_KEY``. The sibling of
``tests/fake_openai.py`` and ``tests/fake_responses.py``; all are ``tests.fake_model``.

``FakeGemini`` answers ``POST /v1beta/models/MODEL:streamGenerateContent`` (SSE ``data:`` chunks, one
``GenerateContentResponse`` each), ``:generateContent`` (one JSON object) and ``:countTokens``. A ``Text``
block is a ``{"text"}`` part, a ``ToolUse`` a ``{"functionCall": {"name", "args"}}`` part. The
conversation's requests (those that offer ``tools``) get the scripted answers in order; side requests
(Gemini CLI's next-speaker and routing checks, which ask for JSON) get ``{}`` as their text.

A tool result comes back in ``contents`` as a ``{"functionResponse": {"name", "response"}}`` part;
``function_responses`` lists them and ``content_texts`` gives every text of a request's ``contents``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fake_model import Block, FakeModelAPI, Recorded, Text, ToolUse, read_json_body, send_payload

__all__ = ["FakeGemini", "Recorded", "Text", "ToolUse", "content_texts", "function_responses"]

MODELS_PREFIX = "/v1beta/models/"


class FakeGemini(FakeModelAPI):
    """The fake Gemini API; thread-safe. ``requests`` lists every request received so far."""

    name = "fake-gemini"

    def __init__(self) -> None:
        super().__init__(_handler)


def function_responses(recorded: Recorded) -> list[dict[str, Any]]:
    """The tool results a request carries back to the model, in order: ``{"name", "response"}``."""
    return [
        part["functionResponse"]
        for content in recorded.body.get("contents") or []
        if isinstance(content, dict)
        for part in content.get("parts") or []
        if isinstance(part, dict) and isinstance(part.get("functionResponse"), dict)
    ]


def content_texts(recorded: Recorded) -> list[str]:
    """Every text part of the request's ``contents``, in order (prompts, hook feedback)."""
    return [
        part["text"]
        for content in recorded.body.get("contents") or []
        if isinstance(content, dict)
        for part in content.get("parts") or []
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]


def function_names(recorded: Recorded) -> set[str]:
    """The function names a request offers the model."""
    return {
        str(declaration.get("name"))
        for tool in recorded.body.get("tools") or []
        if isinstance(tool, dict)
        for declaration in tool.get("functionDeclarations") or []
        if isinstance(declaration, dict)
    }


def _handler(api: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads requests
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            api.record(path, {k.lower(): v for k, v in self.headers.items()}, {}, turn=False)
            self._send(404, "application/json", b'{"error": {"code": 404, "status": "NOT_FOUND"}}')

        def do_POST(self) -> None:
            body = read_json_body(self)
            if body is None:
                self._send(413, "application/json", b'{"error": {"code": 413}}')
                return
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            method = path.rpartition(":")[2] if path.startswith(MODELS_PREFIX) else ""
            if method == "countTokens":
                api.record(path, headers, body, turn=False)
                self._send(200, "application/json", b'{"totalTokens": 10}')
                return
            if method not in ("streamGenerateContent", "generateContent"):
                api.record(path, headers, body, turn=False)
                self._send(404, "application/json", b'{"error": {"code": 404, "status": "NOT_FOUND"}}')
                return
            blocks = api.record(path, headers, body, turn=True)
            if not body.get("tools"):
                blocks = [Text("{}")]  # a side request asking for JSON
            answer = _response(blocks)
            if method == "streamGenerateContent":
                self._send(200, "text/event-stream", b"".join(_chunks(answer)))
            else:
                self._send(200, "application/json", json.dumps(answer).encode())

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            send_payload(self, status, content_type, payload)

    return Handler


def _response(blocks: Sequence[Block]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, Text):
            parts.append({"text": block.text})
        else:
            parts.append({"functionCall": {"name": block.name, "args": block.input}})
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "fake-model",
    }


def _chunks(answer: dict[str, Any]) -> Iterator[bytes]:
    yield f"data: {json.dumps(answer)}\r\n\r\n".encode()
