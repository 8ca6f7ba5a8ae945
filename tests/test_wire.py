"""The auto-pipeline's lean connections (``adapters/redis/wire.py``): which URLs they serve, the
handshake, reply and error parsing, and a relay running on them over TCP with AUTH/SELECT and over a
unix socket, against real servers started here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import BusyLoadingError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.server import EmbeddedRedis
from adapters.redis.wire import WireProtocol
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.errors import BackendUnavailable
from broker.relay import Relay

ADDRESS = ClaudeCodeAddress.parse("127.0.0.1:14111")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedRedis, Path]]:
    """A server with a password and a unix socket (no persistence)."""
    sock = tmp_path_factory.mktemp("wire") / "redis.sock"
    server = EmbeddedRedis(extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    server.start()
    # set after start: the launcher's readiness probe has no password
    with redis.Redis(host="127.0.0.1", port=server.port) as admin:
        admin.config_set("requirepass", "s3cret")
    try:
        yield server, sock
    finally:
        server.stop()


def test_plain_and_unix_urls_use_wire_connections_and_tls_keeps_redis_py() -> None:
    for url, wired in [
        ("redis://127.0.0.1:1/0", True),
        ("redis://user:pw@127.0.0.1:1/3", True),
        ("unix:///tmp/relay-test.sock", True),
        ("rediss://127.0.0.1:1/0", False),
        ("redis://127.0.0.1:1/0?protocol=3", False),
    ]:
        connection = RedisConnection(RedisSettings(url=url))
        assert (connection.pipeline._dialer is not None) is wired, url


async def _round_trip(url: str, prefix: str) -> list[str]:
    connection = RedisConnection(RedisSettings(url=url, prefix=prefix))
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    async with relay:
        await relay.register("alice", ADDRESS, "a-1")
        await relay.register("bob", ADDRESS, "b-1")
        sent = await asyncio.gather(
            *(relay.send("alice", "bob", AgentMessage(kind=Kind.KIND_NOTE, text=f"#{i}")) for i in range(20))
        )
        got = await relay.fetch("bob", 256)
        # concurrent sends land in any order; ids sort by stream position, the order fetch keeps
        assert [e.id for e in got] == sorted(e.id for e in sent)
        done = await relay.ack("bob", [e.id for e in got[:5]])
        assert list(done.acknowledged) == [e.id for e in got[:5]]
        return [e.id for e in got]


async def test_a_relay_runs_over_tcp_with_auth_and_select(guarded: tuple[EmbeddedRedis, Path]) -> None:
    server, _ = guarded
    ids = await _round_trip(f"redis://:s3cret@127.0.0.1:{server.port}/3", "wire-tcp")
    check = redis.Redis(host="127.0.0.1", port=server.port, password="s3cret", db=3, decode_responses=True)
    try:
        assert check.xlen("wire-tcp:inbox:{bob}") == len(ids) - 5
    finally:
        check.close()


async def test_a_relay_runs_over_a_unix_socket(guarded: tuple[EmbeddedRedis, Path]) -> None:
    _, sock = guarded
    ids = await _round_trip(f"unix://:s3cret@{sock}?db=2", "wire-unix")
    assert len(ids) == 20


async def test_a_refused_password_is_a_retryable_backend_error(guarded: tuple[EmbeddedRedis, Path]) -> None:
    server, _ = guarded
    connection = RedisConnection(
        RedisSettings(url=f"redis://:wrong@127.0.0.1:{server.port}/0", prefix="wire-bad")
    )
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    async with relay:
        with pytest.raises(BackendUnavailable) as caught:
            await relay.fetch("alice", 1)
        assert caught.value.retryable


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True


async def test_replies_reach_their_calls_in_order_and_errors_keep_redis_py_classes() -> None:
    protocol = WireProtocol()
    transport = _Transport()
    protocol.connection_made(transport)
    futures = protocol.request(b"(four commands)", 4)
    protocol.data_received(b"$3\r\nab")  # a reply split across reads
    assert not any(f.done() for f in futures)
    protocol.data_received(
        b"c\r\n*2\r\n:1\r\n$-1\r\n-NOSCRIPT No matching script\r\n-LOADING Redis is loading\r\n"
    )
    assert [f.result() if not isinstance(f.result(), Exception) else None for f in futures[:2]] == [
        "abc",
        [1, None],
    ]
    assert isinstance(futures[2].result(), NoScriptError)
    assert isinstance(futures[3].result(), BusyLoadingError)
    assert isinstance(futures[3].result(), RedisConnectionError)  # retried, then backend_unavailable
    assert not protocol.closed and transport.written == [b"(four commands)"]


async def test_unreadable_or_unasked_replies_drop_the_connection() -> None:
    for data in [b"?garbage\r\n", b"+OK\r\n+OK\r\n"]:
        protocol = WireProtocol()
        transport = _Transport()
        protocol.connection_made(transport)
        (future,) = protocol.request(b"PING", 1)
        protocol.data_received(data)
        assert protocol.closed and transport.aborted
        if data.startswith(b"?"):
            with pytest.raises(RedisConnectionError):
                future.result()
        with pytest.raises(RedisConnectionError):
            protocol.request(b"PING", 1)


async def test_a_lost_connection_fails_the_waiting_calls() -> None:
    protocol = WireProtocol()
    protocol.connection_made(_Transport())
    futures = protocol.request(b"x", 2)
    protocol.data_received(b"+OK\r\n")
    protocol.connection_lost(None)
    assert futures[0].result() == "OK"
    with pytest.raises(RedisConnectionError):
        futures[1].result()
    assert not isinstance(futures[0].result(), ResponseError)


class _SilentDialer:
    """Connections to a server that accepts commands and never answers (like a frozen Redis)."""

    async def connect(self) -> WireProtocol:
        protocol = WireProtocol()
        protocol.connection_made(_Transport())
        return protocol


async def test_calls_waiting_for_a_busy_connection_time_out_too() -> None:
    connection = RedisConnection(
        RedisSettings(url="redis://127.0.0.1:1/0", command_timeout=0.2, max_connections=1)
    )
    pipeline = connection.pipeline
    pipeline._dialer = _SilentDialer()  # type: ignore[assignment]
    started = asyncio.get_running_loop().time()
    results = await asyncio.wait_for(
        asyncio.gather(*(pipeline._roundtrip(b"PING", 1) for _ in range(5)), return_exceptions=True), 5
    )
    assert all(isinstance(r, RedisTimeoutError) for r in results), results
    assert asyncio.get_running_loop().time() - started < 0.6  # one timeout, not one per queued call


async def test_scripts_flushed_under_live_connections_are_loaded_again(redis_url: str) -> None:
    connection = RedisConnection(RedisSettings(url=redis_url, prefix="wire-flush"))
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    async with relay:
        await relay.register("alice", ADDRESS, "a-1")
        await relay.send("alice", "alice", AgentMessage(kind=Kind.KIND_NOTE, text="warm"))
        assert connection.pipeline._idle  # a live wire connection, which SCRIPT FLUSH does not close
        with redis.Redis.from_url(redis_url) as admin:
            admin.script_flush()
        sent = await asyncio.gather(
            *(
                relay.send("alice", "alice", AgentMessage(kind=Kind.KIND_NOTE, text=f"#{i}"))
                for i in range(12)
            )
        )
        got = await relay.fetch("alice", 256)
        assert sorted(e.id for e in got[1:]) == sorted(e.id for e in sent)
