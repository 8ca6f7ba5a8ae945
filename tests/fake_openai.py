"""A small fake of the OpenAI chat-completions API on a free loopback port, for driving agent CLIs and
SDKs that speak it (the Copilot CLI with a BYOK ``openai`` provider, opencode's openai-compatible
provider, ...) offline. The twin of ``tests/fake_anthropic.py``; both are ``tests.fake_model``.

``FakeOpenAI`` answers:

- ``POST /v1/chat/completions`` (also without the ``/v1``): streamed as ``chat.completion.chunk`` SSE
  events ending in ``data: [DONE]`` when the request has ``"stream": true`` (with a usage chunk when it
  asks for ``stream_options.include_usage``), one ``chat.completion`` JSON object otherwise. A ``Text``
  block becomes the message's ``content``; each ``ToolUse`` becomes one entry of ``tool_calls``
  (``{"id": "call_…", "type": "function", "function": {"name", "arguments": <JSON text>}}``), and the
  finish reason is then ``tool_calls`` (``stop`` otherwise).
- ``GET /v1/models`` (also ``/models``): the models named so far plus ``fake-model``, so clients that
  list models before a turn find theirs.
- everything else: 404 with an OpenAI-style error body.

Every request is recorded (``requests``: path, lower-cased headers, JSON body), and the conversation's
requests (those that offer ``tools``) get the scripted answers in order: ``api.reply(ToolUse(...))``,
``api.reply(Text(...))``. A tool result comes back to the model as ``{"role": "tool", "tool_call_id",
"content"}``; ``Recorded.last_user_text()`` reads it, and ``tool_results()`` below lists them.

Start it with ``with FakeOpenAI() as api:`` and point the client at ``api.base_url + "/v1"`` (the
usual OpenAI base URL shape). ``FakeOpenAI(fail_first=n)`` answers the first ``n`` chat requests
with a 500, for clients' retry paths.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fake_model import (
    DEFAULT_TEXT,
    Block,
    FakeModelAPI,
    Recorded,
    Text,
    ToolUse,
    read_json_body,
    send_payload,
)

__all__ = ["DEFAULT_TEXT", "FakeOpenAI", "Recorded", "Text", "ToolUse", "tool_results"]

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
MODELS_PATHS = ("/v1/models", "/models")
DEFAULT_MODEL = "fake-model"


def _error(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


class FakeOpenAI(FakeModelAPI):
    """The fake chat-completions API; thread-safe. ``requests`` lists every request received so far."""

    name = "fake-openai"

    def __init__(self, *, fail_first: int = 0) -> None:
        self._ids = itertools.count(1)
        self._failures_left = fail_first
        super().__init__(_handler)

    def _completion_id(self) -> str:
        return f"chatcmpl-fake{next(self._ids):08d}"

    def _fail_now(self) -> bool:
        with self._changed:
            if self._failures_left > 0:
                self._failures_left -= 1
                return True
            return False

    def models(self) -> list[str]:
        """Every model a request named so far, and ``fake-model``."""
        with self._changed:
            named = {str(r.body["model"]) for r in self.requests if isinstance(r.body.get("model"), str)}
        return sorted(named | {DEFAULT_MODEL})


def tool_results(recorded: Recorded) -> list[dict[str, Any]]:
    """The tool results a chat request carries back to the model, in order: ``{"tool_call_id",
    "content"}``, content as sent (text, or a list of parts)."""
    return [
        {"tool_call_id": m.get("tool_call_id"), "content": m.get("content")}
        for m in recorded.body.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "tool"
    ]


def _handler(api: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads requests
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            api.record(path, headers, {}, turn=False)
            if path in MODELS_PATHS:
                listed = [
                    {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in api.models()
                ]
                self._send(200, "application/json", json.dumps({"object": "list", "data": listed}).encode())
                return
            self._send(404, "application/json", _error("not_found_error", f"no route {path}"))

        do_HEAD = do_GET

        def do_POST(self) -> None:
            body = read_json_body(self)
            if body is None:
                self._send(413, "application/json", _error("invalid_request_error", "body too large"))
                return
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            if path not in CHAT_PATHS:
                api.record(path, headers, body, turn=False)
                self._send(404, "application/json", _error("not_found_error", f"no route {path}"))
                return
            if api._fail_now():
                api.record(path, headers, body, turn=False)
                self._send(500, "application/json", _error("server_error", "scripted failure"))
                return
            blocks = api.record(path, headers, body, turn=True)
            model = str(body.get("model") or DEFAULT_MODEL)
            completion_id = api._completion_id()
            if body.get("stream"):
                options = body.get("stream_options")
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                payload = b"".join(_chunks(completion_id, model, blocks, usage=usage))
                self._send(200, "text/event-stream", payload)
            else:
                message = _completion(completion_id, model, blocks)
                self._send(200, "application/json", json.dumps(message).encode())

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            send_payload(self, status, content_type, payload, x_request_id="req_fake")

    return Handler


def _tool_calls(completion_id: str, blocks: Sequence[Block]) -> list[dict[str, Any]]:
    calls = [b for b in blocks if isinstance(b, ToolUse)]
    return [
        {
            "id": f"call_{completion_id.removeprefix('chatcmpl-')}_{i}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.input)},
        }
        for i, call in enumerate(calls)
    ]


def _content(blocks: Sequence[Block]) -> str | None:
    texts = [b.text for b in blocks if isinstance(b, Text)]
    return "".join(texts) if texts else None


def _finish_reason(blocks: Sequence[Block]) -> str:
    return "tool_calls" if any(isinstance(b, ToolUse) for b in blocks) else "stop"


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _completion(completion_id: str, model: str, blocks: Sequence[Block]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _content(blocks)}
    calls = _tool_calls(completion_id, blocks)
    if calls:
        message["tool_calls"] = calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish_reason(blocks), "logprobs": None}
        ],
        "usage": _usage(),
    }


def _chunks(completion_id: str, model: str, blocks: Sequence[Block], *, usage: bool) -> Iterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(data)}\n\n".encode()

    yield chunk({"role": "assistant", "content": ""})
    text = _content(blocks)
    if text:
        yield chunk({"content": text})
    for index, call in enumerate(_tool_calls(completion_id, blocks)):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**opening, "function": {"name": function["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})
    yield chunk({}, _finish_reason(blocks))
    if usage:
        data = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(),
        }
        yield f"data: {json.dumps(data)}\n\n".encode()
    yield b"data: [DONE]\n\n"
