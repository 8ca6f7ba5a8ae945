"""What the fake model APIs share (``tests/fake_anthropic.py``, ``tests/fake_openai.py``): the scripted
blocks a model "says", the record of each request, and a threaded loopback server that keeps them.

A fake is ``FakeModelAPI`` plus a request handler for its wire format. What the model says is
scripted: ``reply`` queues answers (``Text`` and ``ToolUse`` blocks), handed in order to the
conversation's requests (those that offer tools); every other request, and a conversation request
that finds the queue empty, gets ``Text(DEFAULT_TEXT)``. Every request is recorded (``requests``), and
a test waits for the one it expects with ``wait_for`` (bounded). ``hold`` makes conversation requests
wait until ``release`` (a model in a long turn).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

DEFAULT_TEXT = "OK."
MAX_BODY = 64 * 1024 * 1024
HOLD_LIMIT = 120.0


@dataclass(frozen=True)
class Text:
    """A text block the model says."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A tool call the model makes; ``name`` as the client offers it (``mcp__relay__FetchAgentInbox``
    to Claude Code, ``send_agent_message`` to a Copilot session)."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)


Block = Text | ToolUse


@dataclass(frozen=True)
class Recorded:
    """One request a fake received; ``body`` is its JSON as sent."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    """``time.monotonic()`` when it arrived."""

    @property
    def is_conversation(self) -> bool:
        """A turn of the session's conversation (it offers tools), not a side request (a title, a
        summary)."""
        return bool(self.body.get("tools"))

    def text(self) -> str:
        """Every piece of text in the request (system prompt, messages, tool results) as one string."""
        return (
            "\n".join(_strings(self.body.get("system")))
            + "\n"
            + "\n".join(_strings(self.body.get("messages")))
        )

    def last_user_text(self) -> str:
        """The text of the last message the model did not write: the last user message (prompts, hook
        feedback, Anthropic tool results) or OpenAI tool result."""
        for message in reversed(self.body.get("messages") or []):
            if isinstance(message, dict) and message.get("role") in ("user", "tool"):
                return "\n".join(_strings(message.get("content")))
        return ""

    def user_texts(self) -> list[str]:
        """The text of every user message, in order (each queued prompt is one)."""
        return [
            "\n".join(_strings(m.get("content")))
            for m in self.body.get("messages") or []
            if isinstance(m, dict) and m.get("role") == "user"
        ]


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


class FakeModelAPI:
    """The scripted, recording core of a fake; thread-safe. A subclass passes the handler class of its
    wire format (built by a function of the fake, so the handler can reach it)."""

    name = "fake-model"

    def __init__(self, handler: Callable[[Any], type[BaseHTTPRequestHandler]]) -> None:
        self.requests: list[Recorded] = []
        self._script: list[list[Block]] = []
        self._changed = threading.Condition()
        self._held = False
        self._server = QuietHTTPServer(("127.0.0.1", 0), handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)

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

    def hold(self) -> None:
        """Make conversation requests wait (a model in a long turn) until ``release``; at most
        ``HOLD_LIMIT`` seconds each."""
        with self._changed:
            self._held = True

    def release(self) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()

    def pending_replies(self) -> int:
        """Scripted answers not handed out yet."""
        with self._changed:
            return len(self._script)

    def wait_answered(self, timeout: float) -> None:
        """Wait until every scripted answer was handed out (at most ``timeout`` seconds)."""
        with self._changed:
            if not self._changed.wait_for(lambda: not self._script, timeout):
                raise AssertionError(f"{len(self._script)} scripted answers not asked for within {timeout} s")

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

    # -- for the handlers ----------------------------------------------------------------------------

    def record(self, path: str, headers: dict[str, str], body: dict[str, Any], *, turn: bool) -> list[Block]:
        """Keep the request; the blocks to answer with (the next scripted answer when ``turn`` is a
        conversation request's model call and one is queued)."""
        with self._changed:
            recorded = Recorded(path, headers, body, time.monotonic())
            self.requests.append(recorded)
            self._changed.notify_all()
            if turn and recorded.is_conversation:
                self._changed.wait_for(lambda: not self._held, HOLD_LIMIT)
            if turn and recorded.is_conversation and self._script:
                answer = self._script.pop(0)
                self._changed.notify_all()
                return answer
            return [Text(DEFAULT_TEXT)]


def read_json_body(handler: BaseHTTPRequestHandler) -> dict[str, Any] | None:
    """The request body as JSON (``{"unparsed": text}`` when it is not JSON); None when its length is
    out of bounds (answer 413)."""
    length = int(handler.headers.get("content-length") or 0)
    if not 0 <= length <= MAX_BODY:
        return None
    raw = handler.rfile.read(length)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {"unparsed": raw.decode("utf-8", "replace")}
    return body if isinstance(body, dict) else {"unparsed": body}


def send_payload(
    handler: BaseHTTPRequestHandler, status: int, content_type: str, payload: bytes, **headers: str
) -> None:
    """Answer with ``payload`` and a content length (keep-alive works)."""
    handler.send_response(status)
    handler.send_header("content-type", content_type)
    handler.send_header("content-length", str(len(payload)))
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(payload)
