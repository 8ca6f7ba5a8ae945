"""The wake path end to end with the real client: two folders set up by ``relay setup claude-code``
(author and reviewer), ``relay serve`` running, an interactive Claude Code session in each, each at its
own fake Messages API. The author's session is idle; the reviewer's model answers it over MCP
(``SendAgentMessage``); the author's fake API must receive a new model request carrying relay's
summary within a few seconds, and the author's model then reads the message with ``FetchAgentInbox``.
No one types in the author's session. ``.mcp.json`` holds no bearer token and ``git status`` shows no
secret.

STAND-IN: relay's own ``POST /agent/wait`` is not on main yet. ``WaitStandIn`` below is a loopback
proxy in front of the real ``relay serve``: it forwards every request unchanged except
``POST /agent/wait``, which it answers itself with the route's contract, read-only from Redis. Remove it
(and point the folders at ``relay serve`` directly) when the route lands.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import AuthError
from broker.ids import encode_envelope_id
from broker.testing.polling import wait_until
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture
from tests.claude_code_relay import read_json, relay_serving, set_up
from tests.fake_anthropic import FakeAnthropic, QuietHTTPServer, Text, ToolUse

__all__ = ["claude_binary_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WAKE_WITHIN_S = 5.0
ANSWER = "Approved: ship PR 12 once the changelog names the new flag."


class WaitStandIn:
    """STAND-IN for relay's ``POST /agent/wait`` (see the module docstring)."""

    def __init__(self, upstream: str, redis_url: str, key: Path) -> None:
        self.upstream = urlsplit(upstream)
        self.store = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
        self.keyring = load_key_file(key)
        self.keys = Keys()
        self.cursors: dict[str, str] = {}
        self._lock = threading.Lock()
        self.server = QuietHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/mcp/agent"

    def __enter__(self) -> WaitStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.store.close()

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            kept = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
            connection.request(method, path, body=body or None, headers=kept)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        skip = ("transfer-encoding", "connection", "content-length")
        return response.status, [(k, v) for k, v in response.getheaders() if k.lower() not in skip], payload

    def wait(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        agent, session = headers.get("x-csf-agent-id", ""), headers.get("x-csf-session-id", "")
        try:
            self.keyring.verify(headers.get("authorization", "").removeprefix("Bearer "), agent, session)
        except AuthError as exc:
            return 401, {"error": {"code": "unauthorized", "message": str(exc)}}
        timeout = min(int(json.loads(body)["timeout_ms"]), 300_000) / 1000
        deadline = time.monotonic() + timeout
        inbox = self.keys.inbox(agent)
        while True:
            registered = self.store.hget(self.keys.registration(agent), "session")
            if registered != session:
                code = "unregistered_agent" if registered is None else "session_superseded"
                return 409, {"error": {"code": code, "message": code, "retryable": False}}
            with self._lock:
                cursor = self.cursors.get(agent, "0-0")
                entries = self.store.xrange(inbox, f"({cursor}", "+", count=100)
                if entries:
                    self.cursors[agent] = entries[-1][0]
                    return 200, {
                        "count": len(entries),
                        "unacknowledged": self.store.xlen(inbox),
                        "reminder": False,
                        "envelopes": [_envelope(entry_id, fields) for entry_id, fields in entries[:5]],
                    }
            left = deadline - time.monotonic()
            if left <= 0:
                return 200, {
                    "count": 0,
                    "unacknowledged": self.store.xlen(inbox),
                    "reminder": False,
                    "envelopes": [],
                }
            self.store.xread({inbox: cursor}, count=1, block=max(int(min(left, 0.5) * 1000), 1))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if self.command == "POST" and self.path == "/agent/wait":
                    status, answer = stand_in.wait(headers, body)
                    payload, extra = json.dumps(answer).encode(), [("content-type", "application/json")]
                else:
                    status, extra, payload = stand_in.forward(self.command, self.path, headers, body)
                self.send_response(status)
                for name, value in extra:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _serve

        return Handler


def _envelope(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    ms, seq = entry_id.split("-")
    return {
        "id": encode_envelope_id(int(ms), int(seq), fields["nonce"]),
        "from": fields["from"],
        "kind": fields["kind"],
        "preview": fields["text"][:120] + ("…" if len(fields["text"]) > 120 else ""),
        "sent_at": fields["sent_at"],
    }


@contextlib.contextmanager
def _git_repo(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)
    yield folder


def test_the_reviewers_answer_wakes_the_idle_authors_session(
    claude_binary: Path, tmp_path: Path, redis_url: str, store: redis.Redis
) -> None:
    with (
        relay_serving(tmp_path, redis_url) as (serve, key),
        WaitStandIn(serve.url, redis_url, key) as relay,
        _git_repo(tmp_path / "author") as author,
        _git_repo(tmp_path / "reviewer") as reviewer,
        FakeAnthropic() as author_api,
        FakeAnthropic() as reviewer_api,
    ):
        suffix = str(time.monotonic_ns())[-6:]  # agent ids of their own on the shared test Redis
        author_id, reviewer_id = f"author-{suffix}", f"reviewer-{suffix}"
        set_up(author, relay.url, author_id, key)
        set_up(reviewer, relay.url, reviewer_id, key)
        home = ClaudeHome(
            tmp_path / "home", trusted=[author, reviewer], settings={"permissions": {"allow": ["mcp__relay"]}}
        ).write()
        author_api.reply(ToolUse("mcp__relay__FetchAgentInbox", {}))
        author_api.reply(Text("Read the review."))
        note = {"kind": "note", "text": ANSWER}
        reviewer_api.reply(ToolUse("mcp__relay__SendAgentMessage", {"to": author_id, "message": note}))
        reviewer_api.reply(Text("Sent."))

        with InteractiveClaude(
            claude_binary, home, author, env={"ANTHROPIC_BASE_URL": author_api.base_url}
        ) as session:
            registered = Keys().registration(author_id)
            wait_until(
                lambda: store.hget(registered, "session"), 60, "the author's SessionStart hook registered it"
            )
            assert author_api.conversation() == []  # idle: nobody typed, nothing in flight
            with InteractiveClaude(
                claude_binary,
                home,
                reviewer,
                "Tell the author the review result.",
                env={"ANTHROPIC_BASE_URL": reviewer_api.base_url},
            ):
                woken = author_api.wait_for(
                    lambda r: r.is_conversation and f"new message for {author_id}" in r.last_user_text(),
                    60,
                    what="carrying relay's summary",
                )
                # the reviewer's model asked for the send when the fake API answered its first turn: an
                # upper bound of the time from the send to the author's wake
                asked = reviewer_api.conversation()[0].at
                took = woken.at - asked
                fetched = author_api.wait_for(
                    lambda r: ANSWER in r.last_user_text() and '"envelopes"' in r.last_user_text(),
                    60,
                    what="with the fetched message",
                )
            assert session.alive()

        summary = woken.last_user_text()
        assert f"from {reviewer_id} (note, " in summary and f'"{ANSWER}"' in summary
        assert (
            f'blocking error from command "SessionStart:startup": relay: 1 new message for {author_id}'
            in summary
        )
        assert "Call FetchAgentInbox" in summary
        assert took < WAKE_WITHIN_S, f"woken {took:.2f} s after the reviewer's model asked to send"
        assert f'"from":"{reviewer_id}"' in fetched.last_user_text().replace(" ", "")
        for folder in (author, reviewer):
            assert "Bearer" not in (folder / ".mcp.json").read_text()
            assert "headers" not in read_json(folder / ".mcp.json")["mcpServers"]["relay"]
            status = subprocess.run(
                ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=all"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout
            assert status.split() == ["??", ".gitignore"], status
            assert key.read_text().splitlines()[-1] not in (folder / ".gitignore").read_text()
