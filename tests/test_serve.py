"""``relay serve`` as a real process: embedded server, persistence across restarts, clean shutdown,
and service through a Redis outage."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from adapters.redis.server import EmbeddedRedis
from broker.front.auth import agent_headers, load_key_file
from tests.front_support import free_port, key_file, running_front

ROOT = Path(__file__).resolve().parents[1]
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


class Serve:
    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, port: int, timeout: float = 30.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "serve", "--port", str(port), *self.args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"relay serve exited: {self.log.read_text()}")
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"relay serve did not become ready: {self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def make(*args: str) -> Serve:
        serve = Serve(list(args), tmp_path / f"serve-{len(started)}.log")
        started.append(serve)
        return serve

    yield make
    for serve in started:
        serve.kill()


def _call(url: str, headers: dict[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tools/call over plain HTTP, the way any MCP client in the 2025-11-25 era posts it."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    response = httpx2.post(
        url,
        json=body,
        headers={
            **headers,
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-11-25",
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert not result.get("isError"), result
    return dict(result["structuredContent"])


def test_embedded_server_keeps_registrations_and_envelopes_across_restarts(
    tmp_path: Path, serve_factory: Any
) -> None:
    key = key_file(tmp_path)
    keyring = load_key_file(key)
    data = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp/agent"
    alice = agent_headers(keyring, "alice", "a-1")
    bob = agent_headers(keyring, "bob", "b-1")

    first = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key))
    first.start(port)
    _call(url, alice, "RegisterAgentAddress", REGISTER)
    _call(url, bob, "RegisterAgentAddress", REGISTER)
    sent = [
        _call(url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": f"note {i}"}})[
            "id"
        ]
        for i in range(3)
    ]
    assert [e["id"] for e in _call(url, bob, "FetchAgentInbox", {"limit": 1})["envelopes"]] == sent[:1]
    assert first.stop() == 0
    log = first.log.read_text()
    assert "embedded" in log and str(data.resolve()) in log
    with pytest.raises(httpx2.HTTPError):
        httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1)

    second = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key))
    second.start(port)
    got = _call(url, bob, "FetchAgentInbox", {"limit": 16})["envelopes"]
    assert [e["id"] for e in got] == sent
    assert _call(url, bob, "AcknowledgeAgentInbox", {"ids": sent})["acknowledged"] == sent
    assert second.stop(signal.SIGINT) == 0


def test_without_a_key_file_the_agent_endpoint_is_not_served(tmp_path: Path, serve_factory: Any) -> None:
    port = free_port()
    serve = serve_factory("--data-dir", str(tmp_path / "data"))
    serve.start(port)
    assert httpx2.post(f"http://127.0.0.1:{port}/mcp/agent", json={}).status_code == 404
    assert "/mcp/agent is not served" in serve.log.read_text()
    assert "csf_relay_envelopes_sent_total" in httpx2.get(f"http://127.0.0.1:{port}/metrics").text
    assert serve.stop() == 0


@pytest.mark.parametrize("problem", ["missing", "empty", "loose"])
def test_bad_key_files_are_refused_with_one_line(tmp_path: Path, problem: str) -> None:
    key = tmp_path / "relay.key"
    if problem == "empty":
        key.write_text("")
        key.chmod(0o600)
    elif problem == "loose":
        key_file(tmp_path).chmod(0o644)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--port",
            "0",
            "--agent-mcp-key-file",
            str(key),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("relay: error:"), result.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.asyncio
async def test_redis_outage_gives_retryable_errors_and_service_resumes(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always")
    server.start()
    try:
        async with running_front(server.url) as front, front.client("alice", "a") as alice:
            await alice.call_tool("RegisterAgentAddress", REGISTER)
            kept = await alice.call_tool(
                "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "kept"}}
            )
            assert not kept.is_error
            server.kill()
            started = time.monotonic()
            failed = await asyncio.wait_for(
                alice.call_tool("SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "lost?"}}),
                15,
            )
            assert time.monotonic() - started < 10
            error = json.loads(failed.content[0].text)["error"]
            assert failed.is_error and error["code"] == "backend_unavailable" and error["retryable"] is True
            fetch_failed = await asyncio.wait_for(alice.call_tool("FetchAgentInbox", {"wait_ms": 1000}), 15)
            assert fetch_failed.is_error
            async with httpx2.AsyncClient(base_url=front.base) as http:
                assert (await http.get("/readyz")).status_code == 503
                server.restart()
                assert (await http.get("/readyz")).status_code == 200
            result = await alice.call_tool("FetchAgentInbox", {})
            assert not result.is_error, result.content
            texts = [e["message"]["text"] for e in result.structured_content["envelopes"]]
            assert texts == ["kept"]
            again = await alice.call_tool(
                "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "after"}}
            )
            assert not again.is_error
    finally:
        server.stop()


def test_serve_on_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "relay.sock"
    key = key_file(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--uds",
            str(sock),
            "--agent-mcp-key-file",
            str(key),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        transport = httpx2.HTTPTransport(uds=str(sock))
        with httpx2.Client(transport=transport, base_url="http://localhost") as http:
            deadline = time.monotonic() + 30
            ready = False
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    ready = http.get("/readyz", timeout=1).status_code == 200
                except httpx2.HTTPError:
                    ready = False
                if ready:
                    break
                time.sleep(0.05)
            assert ready
            headers = agent_headers(load_key_file(key), "alice", "a-1")
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "RegisterAgentAddress",
                    "arguments": {"provider": "claudecode", "endpoint": f"unix:{sock}"},
                },
            }
            response = http.post(
                "/mcp/agent",
                json=body,
                headers={
                    **headers,
                    "accept": "application/json, text/event-stream",
                    "mcp-protocol-version": "2025-11-25",
                },
            )
            assert response.json()["result"]["structuredContent"]["endpoint"] == f"unix:{sock}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "broker", "serve", "--port", str(port), "--data-dir", str(tmp_path / "d")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("relay: error: cannot listen on 127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
