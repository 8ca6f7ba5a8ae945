"""``relay serve``'s HTTP limits against real slow and oversized clients on raw sockets: idle
connections, header dribblers, slow bodies, huge headers, too many connections, and Host/Origin
spellings that only a prefix match would accept. Limits are set short (0.5 s) so that every wait is
bounded; a legitimate agent's call through the official ``mcp`` client still succeeds while hundreds
of slow connections are held."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from tests.front_support import key_file
from tests.processes import MCP_HEADERS, REGISTER, ROOT, ServeProcess, tool_call_body

SHORT = "0.5"
FETCH = json.dumps(tool_call_body("FetchAgentInbox", {"limit": 1})).encode()


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return key_file(tmp_path_factory.mktemp("key"))


@pytest.fixture(scope="module")
def limited(redis_url: str, key: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A ``relay serve`` whose time limits are all 0.5 s."""
    log = tmp_path_factory.mktemp("limited") / "serve.log"
    args = ["--redis-url", redis_url, "--agent-mcp-key-file", str(key)]
    args += ["--idle-timeout", SHORT, "--header-timeout", SHORT, "--body-timeout", SHORT]
    serve = ServeProcess(args, log).start()
    yield serve
    serve.stop()
    assert "Traceback" not in log.read_text()


def headers_of(key: Path, agent: str) -> dict[str, str]:
    return agent_headers(load_key_file(key), agent, f"{agent}-1")


def connect(serve: ServeProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", serve.port), timeout=5)
    return sock


def request_head(serve: ServeProcess, extra: dict[str, str], length: int) -> bytes:
    lines = ["POST /mcp/agent HTTP/1.1", f"Host: 127.0.0.1:{serve.port}"]
    lines += [f"{name}: {value}" for name, value in {**MCP_HEADERS, **extra}.items()]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_until_closed(sock: socket.socket, within: float = 10.0, dribble: bytes = b"") -> bytes:
    """Everything the server sends until it closes the connection (within ``within`` seconds), sending
    ``dribble`` every 0.1 s meanwhile, the way a slow client keeps a naive server waiting."""
    received = b""
    deadline = time.monotonic() + within
    sock.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if dribble:
                with contextlib.suppress(OSError):
                    sock.sendall(dribble)
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept the connection open for {within} s: {received[:200]!r}")


def status_and_error(response: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def test_a_silent_connection_is_closed_after_the_idle_timeout(limited: ServeProcess) -> None:
    with connect(limited) as sock:
        assert read_until_closed(sock) == b""


def test_a_keep_alive_connection_is_closed_after_the_idle_timeout(limited: ServeProcess) -> None:
    with connect(limited) as sock:
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{limited.port}\r\n\r\n".encode())
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")


def test_headers_that_dribble_in_get_408_after_the_header_timeout(limited: ServeProcess) -> None:
    with connect(limited) as sock:
        sock.sendall(f"POST /mcp/agent HTTP/1.1\r\nHost: 127.0.0.1:{limited.port}\r\n".encode())
        status, error = status_and_error(read_until_closed(sock, dribble=b"X-Slow: 1\r\n"))
    assert status == 408
    assert error["data"] == {"limit": 0.5, "option": "--header-timeout"}


def test_a_body_that_dribbles_in_gets_408_after_the_body_timeout(limited: ServeProcess, key: Path) -> None:
    with connect(limited) as sock:
        sock.sendall(request_head(limited, headers_of(key, "slowbody"), len(FETCH)) + FETCH[:5])
        status, error = status_and_error(read_until_closed(sock, dribble=b" "))
    assert status == 408
    assert error["data"] == {"limit": 0.5, "option": "--body-timeout"}
    assert "--body-timeout" in error["message"]


def test_32_mb_of_headers_are_refused_without_being_read(limited: ServeProcess) -> None:
    """The request is answered 431 (or the connection reset) once 64 KiB are in: the client cannot
    push more than the kernel's socket buffers hold beyond that."""
    sent = 0
    with connect(limited) as sock:
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{limited.port}\r\nX-Big: ".encode())
        chunk = b"a" * 65536
        with contextlib.suppress(OSError):
            while sent < 32 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        with contextlib.suppress(OSError):
            response = read_until_closed(sock)
            if response:
                status, error = status_and_error(response)
                assert status == 431 and error["data"]["option"] == "--max-header-bytes"
    assert sent < 16 * 1024 * 1024


def test_an_oversized_body_is_a_json_rpc_error_naming_the_limit_and_the_flag(
    limited: ServeProcess, key: Path
) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"' + b"a" * 300_000 + b'"}}'
    with limited.client() as http:
        response = http.post("/mcp/agent", content=body, headers={**MCP_HEADERS, **headers_of(key, "big")})
    assert response.status_code == 413
    error = response.json()["error"]
    assert "262144" in error["message"] and "--max-body-bytes" in error["message"]


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [
        ("host", "[::1]:{port}x", 421),
        ("host", "127.0.0.1:{port}0", 421),
        ("host", "127.0.0.1:1{port}", 421),
        ("host", "127.0.0.1.evil.example:{port}", 421),
        ("origin", "http://127.0.0.1:80@evil.example", 403),
        ("origin", "http://localhost:{port}.evil.example", 403),
        ("origin", "http://127.0.0.1:{port}/path", 403),
    ],
)
def test_host_and_origin_are_matched_exactly(
    limited: ServeProcess, key: Path, name: str, value: str, status: int
) -> None:
    headers = {**MCP_HEADERS, **headers_of(key, "hosts"), name: value.format(port=limited.port)}
    with limited.client() as http:
        response = http.post("/mcp/agent", content=FETCH, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:{port}", None),
        ("localhost:{port}", "http://localhost:3000"),
        ("[::1]:{port}", "http://[::1]"),
    ],
)
def test_loopback_host_and_origin_are_accepted(
    limited: ServeProcess, key: Path, host: str, origin: str | None
) -> None:
    headers = {**MCP_HEADERS, **headers_of(key, "hosts"), "host": host.format(port=limited.port)}
    if origin is not None:
        headers["origin"] = origin
    with limited.client() as http:
        response = http.post("/mcp/agent", content=FETCH, headers=headers)
    assert response.status_code == 200, response.text


def test_an_agent_is_served_while_hundreds_of_slow_connections_are_held(
    redis_url: str, key: Path, tmp_path: Path
) -> None:
    # long time limits, so that the slow connections stay held for the whole test (the 0.5 s server
    # above shows they are closed); the connection bound is low enough to reach
    long_limits = ["--idle-timeout", "120", "--header-timeout", "120", "--body-timeout", "120"]
    serve = ServeProcess(
        [
            "--redis-url",
            redis_url,
            "--agent-mcp-key-file",
            str(key),
            "--max-connections",
            "320",
            *long_limits,
        ],
        tmp_path / "serve.log",
    ).start()
    held: list[socket.socket] = []
    try:
        slow_head = f"POST /mcp/agent HTTP/1.1\r\nHost: 127.0.0.1:{serve.port}\r\nX-Slow: ".encode()
        slow_body = request_head(serve, headers_of(key, "slow"), len(FETCH)) + FETCH[:5]
        for i in range(300):
            sock = connect(serve)
            held.append(sock)
            if i % 3 == 1:
                sock.sendall(slow_head)
            elif i % 3 == 2:
                sock.sendall(slow_body)
        asyncio.run(_register_send_fetch(serve, key))
        # the held connections are all still open: a further 20 reach the bound and get 503
        statuses = []
        for _ in range(25):
            sock = connect(serve)
            held.append(sock)
            sock.settimeout(0.2)
            with contextlib.suppress(TimeoutError):
                statuses.append(sock.recv(100)[:12])
        assert b"HTTP/1.1 503" in statuses
    finally:
        for sock in held:
            sock.close()
        serve.stop()
    assert "Traceback" not in serve.log.read_text()


async def _register_send_fetch(serve: ServeProcess, key: Path) -> None:
    http = httpx2.AsyncClient(headers=headers_of(key, "legit"), timeout=30)
    async with http, Client(streamable_http_client(serve.url, http_client=http)) as client:
        registered = await client.call_tool("RegisterAgentAddress", REGISTER)
        assert not registered.is_error, registered
        sent = await client.call_tool(
            "SendAgentMessage", {"to": "legit", "message": {"kind": 1, "text": "hi"}}
        )
        assert not sent.is_error, sent
        fetched = await client.call_tool("FetchAgentInbox", {"limit": 1})
        assert fetched.structured_content is not None
        assert len(fetched.structured_content["envelopes"]) == 1


def test_an_abandoned_body_and_a_malformed_chunk_log_one_line_and_no_traceback(
    limited: ServeProcess, key: Path
) -> None:
    before = limited.log.read_text().count("request abandoned")
    with connect(limited) as sock:
        sock.sendall(request_head(limited, headers_of(key, "leaver"), len(FETCH)) + FETCH[:5])
    chunked = request_head(limited, headers_of(key, "chunker"), 0).replace(
        b"Content-Length: 0", b"Transfer-Encoding: chunked"
    )
    with connect(limited) as sock:
        sock.sendall(chunked + b'5\r\n{"jso\r\nzz-not-a-size\r\n')
        read_until_closed(sock)
    wait_until(lambda: limited.log.read_text().count("request abandoned") > before, 10, "the abandoned line")
    wait_until(lambda: "Invalid HTTP request received" in limited.log.read_text(), 10, "the malformed line")
    log = limited.log.read_text()
    assert log.count("request abandoned") == before + 1  # the malformed chunk is logged once, by the server
    assert "Traceback" not in log and "ClientDisconnect" not in log and "Error handling POST" not in log


@pytest.mark.parametrize(
    ("soft", "hard", "raised", "warned"), [(256, 4096, 2024, False), (256, 512, 512, True)]
)
def test_the_open_files_limit_is_raised_to_fit_max_connections(
    soft: int, hard: int, raised: int, warned: bool
) -> None:
    code = (
        "import logging, resource\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from relay.http_limits import allow_open_files\n"
        "allow_open_files(1000)\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == raised
    assert ("--max-connections" in done.stderr) is warned, done.stderr
