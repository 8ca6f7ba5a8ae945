"""``relay serve`` as a real process: embedded server, persistence across restarts, clean shutdown,
and service through a Redis outage."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.embedded_state import LOCK_FILE
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers, generate_key
from broker.testing.polling import wait_until
from tests.front_support import free_port, key_file, running_front
from tests.processes import MCP_HEADERS, REGISTER, ServeProcess, call_tool_sync, ok_sync, run_relay


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def make(*args: str, port: int | None = None) -> ServeProcess:
        serve = ServeProcess(args, tmp_path / f"serve-{len(started)}.log", port=port)
        started.append(serve)
        return serve

    yield make
    for serve in started:
        serve.kill()


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

    first = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key), port=port)
    first.start()
    ok_sync(url, alice, "RegisterAgentAddress", REGISTER)
    ok_sync(url, bob, "RegisterAgentAddress", REGISTER)
    sent = [
        ok_sync(url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": f"note {i}"}})[
            "id"
        ]
        for i in range(3)
    ]
    assert [e["id"] for e in ok_sync(url, bob, "FetchAgentInbox", {"limit": 1})["envelopes"]] == sent[:1]
    assert first.stop() == 0
    log = first.log.read_text()
    assert "embedded" in log and str(data.resolve()) in log
    with pytest.raises(httpx2.HTTPError):
        httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1)

    second = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key), port=port)
    second.start()
    got = ok_sync(url, bob, "FetchAgentInbox", {"limit": 16})["envelopes"]
    assert [e["id"] for e in got] == sent
    assert ok_sync(url, bob, "AcknowledgeAgentInbox", {"ids": sent})["acknowledged"] == sent
    assert second.stop(signal.SIGINT) == 0


def test_a_killed_serve_takes_its_embedded_server_along_and_starts_again(
    tmp_path: Path, serve_factory: Any
) -> None:
    """SIGKILL (or the OOM killer) gives ``relay serve`` no chance to stop its embedded server: the
    kernel sends it SIGTERM instead, it flushes its append-only file and exits, and the data dir is
    free for the next ``relay serve``, with the data intact."""
    key = key_file(tmp_path)
    keyring = load_key_file(key)
    data = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp/agent"
    alice = agent_headers(keyring, "alice", "a-1")
    first = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key), port=port)
    first.start()
    ok_sync(url, alice, "RegisterAgentAddress", REGISTER)
    sent = ok_sync(url, alice, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "kept"}})
    redis_pid = int((data / LOCK_FILE).read_text())
    first.kill()

    lock = os.open(data / LOCK_FILE, os.O_RDWR)
    try:

        def locked() -> bool:  # the lock is released when the orphaned server exits
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_until(locked, 10, f"embedded server {redis_pid} releasing {data}", interval=0.05)
        fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)

    second = serve_factory("--data-dir", str(data), "--agent-mcp-key-file", str(key), port=port)
    second.start()
    got = ok_sync(url, alice, "FetchAgentInbox", {"limit": 16})["envelopes"]
    assert [e["id"] for e in got] == [sent["id"]]
    assert second.stop() == 0


def test_sighup_reloads_the_key_file_for_rotation_without_a_restart(
    tmp_path: Path, serve_factory: Any
) -> None:
    """Rotation by SIGHUP: new key first (old tokens still verify, new ones too), old key removed
    (its tokens refused at once); a key file that does not load keeps the keys in use."""
    old_key, new_key = generate_key(), generate_key()
    path = tmp_path / "relay.key"

    def write(*lines: str) -> None:
        path.write_text("".join(f"{line}\n" for line in lines))
        path.chmod(0o600)

    write(old_key)
    serve = serve_factory("--data-dir", str(tmp_path / "data"), "--agent-mcp-key-file", str(path))
    serve.start()
    old = agent_headers(load_key_file(path), "alice", "a-1")
    write(new_key, old_key)
    new = agent_headers(load_key_file(path), "alice", "a-1")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    def statuses() -> tuple[int, ...]:
        with httpx2.Client(timeout=10) as http:
            return tuple(
                http.post(serve.url, json=body, headers={**MCP_HEADERS, **headers}).status_code
                for headers in (old, new)
            )

    def reload(expect: str) -> None:
        count = serve.log.read_text().count(expect)
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: serve.log.read_text().count(expect) > count, 10, f"{expect!r} logged again")

    assert statuses() == (200, 401)  # the file on disk changed, the worker has not read it yet
    reload("key file reloaded")
    assert statuses() == (200, 200)
    write(new_key)
    reload("key file reloaded")
    assert statuses() == (401, 200)
    path.chmod(0o644)  # refused: group/other-readable
    reload("key file not reloaded")
    assert statuses() == (401, 200)
    assert serve.stop() == 0


def test_without_a_key_file_serve_signs_with_the_data_dirs_own_key(
    tmp_path: Path, serve_factory: Any
) -> None:
    serve = serve_factory("--data-dir", str(tmp_path / "data"))
    serve.start()
    key = tmp_path / "data" / "relay.key"
    assert f"created signing key {key}" in serve.log.read_text()
    headers = agent_headers(load_key_file(key), "alice", "a-1")
    assert ok_sync(serve.url, headers, "RegisterAgentAddress", REGISTER)["agent"] == "alice"
    assert httpx2.post(serve.url, json={}).status_code == 401
    assert "csf_relay_envelopes_sent_total" in httpx2.get(f"{serve.base}/metrics").text
    assert serve.stop() == 0


@pytest.mark.parametrize("problem", ["missing", "empty", "loose"])
def test_bad_key_files_are_refused_with_one_line(tmp_path: Path, problem: str) -> None:
    key = tmp_path / "relay.key"
    if problem == "empty":
        key.write_text("")
        key.chmod(0o600)
    elif problem == "loose":
        key_file(tmp_path).chmod(0o644)
    result = run_relay("serve", "--port", "0", "--agent-mcp-key-file", key, "--data-dir", tmp_path / "d")
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
    serve = ServeProcess(
        ["--agent-mcp-key-file", str(key), "--data-dir", str(tmp_path / "data")],
        tmp_path / "serve.log",
        uds=sock,
    )
    try:
        serve.start()
        with serve.client() as http:
            headers = agent_headers(load_key_file(key), "alice", "a-1")
            arguments = {"provider": "claudecode", "endpoint": f"unix:{sock}"}
            result = call_tool_sync("/mcp/agent", headers, "RegisterAgentAddress", arguments, http=http)
            assert result["structuredContent"]["endpoint"] == f"unix:{sock}"
        assert serve.stop() == 0
    finally:
        serve.kill()


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_relay("serve", "--port", str(port), "--data-dir", tmp_path / "d")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("relay: error: cannot listen on 127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
