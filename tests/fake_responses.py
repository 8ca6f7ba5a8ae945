"""A small fake of the OpenAI Responses API on a free loopback port, for driving Codex offline (a
custom model provider whose ``base_url`` is ``api.base_url + "/v1"`` and ``wire_api = "responses"``).
The sibling of ``tests/fake_openai.py`` (chat completions); all are ``tests.fake_model``.

``FakeResponses`` answers ``POST /v1/responses`` (also without the ``/v1``) as the SSE stream Codex
reads: ``response.created``, one ``response.output_item.added``/``.done`` pair per block (a ``Text``
is a ``message`` item with ``output_text``, a ``ToolUse`` a ``function_call`` item with ``call_id``,
``name`` and JSON ``arguments``), then ``response.completed`` with usage. ``GET /v1/models`` lists
``fake-model``; everything else is a 404.

The conversation's requests (those that offer ``tools``) get the scripted answers in order. A tool
result comes back as an ``input`` item ``{"type": "function_call_output", "call_id", "output"}``;
``tool_outputs`` lists them, ``input_texts`` gives every text of a request's ``input`` (prompts,
hook feedback, tool results).
"""

from __future__ import annotations

import itertools
import json
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

__all__ = ["DEFAULT_TEXT", "FakeResponses", "Recorded", "Text", "ToolUse", "input_texts", "tool_outputs"]

RESPONSES_PATHS = ("/v1/responses", "/responses")
MODELS_PATHS = ("/v1/models", "/models")


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "not_found_error", "code": None}}).encode()


class FakeResponses(FakeModelAPI):
    """The fake Responses API; thread-safe. ``requests`` lists every request received so far."""

    name = "fake-responses"

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        super().__init__(_handler)

    def _next_id(self) -> int:
        return next(self._ids)

    def turns(self) -> list[Recorded]:
        """The model calls of the conversation (requests to the Responses path that offer tools)."""
        return [r for r in self.conversation() if r.path in RESPONSES_PATHS]


def tool_outputs(recorded: Recorded) -> list[dict[str, Any]]:
    """The tool results a request carries back to the model, in order: ``{"call_id", "output"}``,
    output as sent (text, or a list of content parts)."""
    return [
        {"call_id": item.get("call_id"), "output": item.get("output")}
        for item in recorded.body.get("input") or []
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def input_texts(recorded: Recorded) -> list[str]:
    """Every text of the request's ``input`` items, in order (messages' content parts, tool outputs)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for key in ("text", "content", "output"):
                if key in value:
                    walk(value[key])

    walk(recorded.body.get("input"))
    return found


def _handler(api: FakeResponses) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads requests
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            api.record(path, {k.lower(): v for k, v in self.headers.items()}, {}, turn=False)
            if path in MODELS_PATHS:
                listed = [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]
                self._send(200, "application/json", json.dumps({"object": "list", "data": listed}).encode())
                return
            self._send(404, "application/json", _error(f"no route {path}"))

        def do_POST(self) -> None:
            body = read_json_body(self)
            if body is None:
                self._send(413, "application/json", _error("body too large"))
                return
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            if path not in RESPONSES_PATHS:
                api.record(path, headers, body, turn=False)
                self._send(404, "application/json", _error(f"no route {path}"))
                return
            blocks = api.record(path, headers, body, turn=True)
            number = api._next_id()
            model = str(body.get("model") or "fake-model")
            self._send(200, "text/event-stream", b"".join(_events(number, model, blocks)))

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            send_payload(self, status, content_type, payload, x_request_id="req_fake")

    return Handler


def _items(number: int, blocks: Sequence[Block]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        if isinstance(block, Text):
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{number}_{index}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": block.text, "annotations": []}],
                }
            )
        else:
            call = {
                "type": "function_call",
                "id": f"fc_{number}_{index}",
                "status": "completed",
                "call_id": f"call_{number}_{index}",
                "name": block.name,
                "arguments": json.dumps(block.input),
            }
            namespace, dot, name = block.name.rpartition(".")
            if dot:  # a tool of a namespace (Codex offers an MCP server's tools as one: mcp__relay)
                call |= {"namespace": namespace, "name": name}
            items.append(call)
    return items or _items(number, [Text(DEFAULT_TEXT)])


def _events(number: int, model: str, blocks: Sequence[Block]) -> Iterator[bytes]:
    response_id = f"resp_fake{number:08d}"
    sequence = itertools.count()

    def event(kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": next(sequence), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    shell = {"id": response_id, "object": "response", "model": model, "output": []}
    yield event("response.created", response={**shell, "status": "in_progress"})
    items = _items(number, blocks)
    for index, item in enumerate(items):
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=text,
            )
        yield event("response.output_item.done", output_index=index, item=item)
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    yield event(
        "response.completed", response={**shell, "status": "completed", "output": items, "usage": usage}
    )
