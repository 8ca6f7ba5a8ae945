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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

DEFAULT_TEXT = "OK."
MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class Text:
    """A text block the model says."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A tool call the model makes; ``name`` as Claude Code offers it (``mcp__relay__FetchAgentInbox``)."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)


Block = Text | ToolUse


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    """``time.monotonic()`` when it arrived."""

    @property
    def is_conversation(self) -> bool:
        """A turn of the session's conversation (it offers tools), not a side request."""
        return bool(self.body.get("tools"))

    def text(self) -> str:
        """Every piece of text in the request (system prompt, messages, tool results) as one string."""
        return (
            "\n".join(_strings(self.body.get("system")))
            + "\n"
            + "\n".join(_strings(self.body.get("messages")))
        )

    def last_user_text(self) -> str:
        """The text of the last user message (where hook feedback and tool results arrive)."""
        for message in reversed(self.body.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "user":
                return "\n".join(_strings(message.get("content")))
        return ""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key in ("text", "content"):
            if key in value:
                yield from _strings(value[key])


class QuietHTTPServer(ThreadingHTTPServer):
    """A threaded loopback HTTP server that says nothing when a client goes away mid-answer (a session
    stopped by the test), and serves each connection on a daemon thread."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class FakeAnthropic:
    """The fake API; thread-safe. ``requests`` lists every request received so far, in order."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: list[list[Block]] = []
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        self._server = QuietHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-anthropic", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    # -- scripting and waiting ---------------------------------------------------------------------

    def reply(self, *blocks: Block) -> None:
        """Queue one answer for the next conversation request that finds the queue non-empty."""
        with self._changed:
            self._script.append(list(blocks))

    def conversation(self) -> list[Recorded]:
        """The conversation requests received so far."""
        with self._changed:
            return [r for r in self.requests if r.is_conversation]

    def wait_for(
        self, predicate: Callable[[Recorded], bool], timeout: float, *, after: int = 0, what: str = ""
    ) -> Recorded:
        """The first request (from index ``after`` on) that satisfies ``predicate``; waits at most
        ``timeout`` seconds, then fails naming ``what`` and the requests seen."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for recorded in self.requests[after:]:
                    if predicate(recorded):
                        return recorded
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [r.last_user_text()[-200:] for r in self.requests]
                    raise AssertionError(f"no request {what or 'matched'} within {timeout} s; saw {seen}")
                self._changed.wait(left)

    # -- serving -----------------------------------------------------------------------------------

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> list[Block]:
        with self._changed:
            recorded = Recorded(path, headers, body, time.monotonic())
            self.requests.append(recorded)
            self._changed.notify_all()
            if path == "/v1/messages" and recorded.is_conversation and self._script:
                return self._script.pop(0)
            return [Text(DEFAULT_TEXT)]

    def _message_id(self) -> str:
        return f"msg_fake{next(self._ids):08d}"


def _handler(api: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads requests
            pass

        def do_GET(self) -> None:
            self._send(404, "application/json", b'{"type":"error","error":{"type":"not_found_error"}}')

        do_HEAD = do_GET

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if not 0 <= length <= MAX_BODY:
                self._send(413, "application/json", b"{}")
                return
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"unparsed": raw.decode("utf-8", "replace")}
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            if path == "/v1/messages/count_tokens":
                api._record(path, headers, body)
                self._send(200, "application/json", b'{"input_tokens": 10}')
                return
            if path != "/v1/messages":
                api._record(path, headers, body)
                self._send(404, "application/json", b'{"type":"error","error":{"type":"not_found_error"}}')
                return
            blocks = api._record(path, headers, body)
            model = str(body.get("model") or "claude-fake")
            message_id = api._message_id()
            if body.get("stream"):
                self._send(200, "text/event-stream", _stream(message_id, model, blocks))
            else:
                self._send(200, "application/json", json.dumps(_message(message_id, model, blocks)).encode())

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.send_header("request-id", "req_fake")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

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
