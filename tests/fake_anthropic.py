"""A small fake of the Anthropic Messages API on a free loopback port, for driving Claude Code offline.

``FakeAnthropic`` answers ``POST /v1/messages`` (streamed as ``message_start ... message_stop`` SSE when
the request asks for a stream, one JSON message otherwise) and ``POST /v1/messages/count_tokens``;
every other path gets a 404. It records every request body, and a test waits for the one it expects
with ``wait_for`` (bounded). What the model "says" is scripted: ``reply`` queues answers (``Text`` or
``ToolUse`` blocks) that are handed, in order, to the conversation's requests (those that offer
tools); everything else, and a conversation request when the queue is empty, gets a short text.

Start it with ``with FakeAnthropic() as api:`` and point ``ANTHROPIC_BASE_URL`` at ``api.base_url``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fake_model import (
    DEFAULT_TEXT,
    Block,
    FakeModelAPI,
    QuietHTTPServer,
    Recorded,
    Text,
    ToolUse,
    read_json_body,
    send_payload,
)

__all__ = ["DEFAULT_TEXT", "FakeAnthropic", "QuietHTTPServer", "Recorded", "Text", "ToolUse"]

NOT_FOUND = b'{"type":"error","error":{"type":"not_found_error"}}'


class FakeAnthropic(FakeModelAPI):
    """The fake Messages API; thread-safe. ``requests`` lists every request received so far, in order."""

    name = "fake-anthropic"

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        super().__init__(_handler)

    def _message_id(self) -> str:
        return f"msg_fake{next(self._ids):08d}"


def _handler(api: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads requests
            pass

        def do_GET(self) -> None:
            self._send(404, "application/json", NOT_FOUND)

        do_HEAD = do_GET

        def do_POST(self) -> None:
            body = read_json_body(self)
            if body is None:
                self._send(413, "application/json", b"{}")
                return
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            if path == "/v1/messages/count_tokens":
                api.record(path, headers, body, turn=False)
                self._send(200, "application/json", b'{"input_tokens": 10}')
                return
            if path != "/v1/messages":
                api.record(path, headers, body, turn=False)
                self._send(404, "application/json", NOT_FOUND)
                return
            blocks = api.record(path, headers, body, turn=True)
            model = str(body.get("model") or "claude-fake")
            message_id = api._message_id()
            if body.get("stream"):
                self._send(200, "text/event-stream", _stream(message_id, model, blocks))
            else:
                self._send(200, "application/json", json.dumps(_message(message_id, model, blocks)).encode())

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            send_payload(self, status, content_type, payload, request_id="req_fake")

    return Handler


def _block_json(message_id: str, index: int, block: Block) -> dict[str, Any]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    tool_id = f"toolu_{message_id.removeprefix('msg_')}_{index}"
    return {"type": "tool_use", "id": tool_id, "name": block.name, "input": block.input}


def _stop_reason(blocks: Sequence[Block]) -> str:
    return "tool_use" if any(isinstance(b, ToolUse) for b in blocks) else "end_turn"


def _usage(output: int) -> dict[str, int]:
    return {
        "input_tokens": 10,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _message(message_id: str, model: str, blocks: Sequence[Block]) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_block_json(message_id, i, b) for i, b in enumerate(blocks)],
        "stop_reason": _stop_reason(blocks),
        "stop_sequence": None,
        "usage": _usage(5),
    }


def _stream(message_id: str, model: str, blocks: Sequence[Block]) -> bytes:
    start = {**_message(message_id, model, []), "stop_reason": None, "usage": _usage(1)}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(blocks):
        whole = _block_json(message_id, index, block)
        if isinstance(block, Text):
            opening: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block.text}
        else:
            opening = {**whole, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.input)}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(blocks), "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()
