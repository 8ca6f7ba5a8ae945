"""The mail-pending wait under load: wake latency and the cost of idle waiters on one worker.

Called from ``bench/run.py`` (``wake_figures``); runnable alone too, which also reports the wake latency
of each coding-agent CLI path (``bench/wake_clis.py``: Claude Code, Codex, Gemini CLI)::

    python bench/wake.py [--idle 10000] [--samples 300] [--cli-samples 20] [--clis-only]

``relay serve`` workers on the bench's Redis, each with ``--max-connections`` above the waiters it is
to hold (the default, 1000, would answer the rest 503). The bench process registers the agents through relay's
core (the same scripts the worker runs) and holds the waiters as plain HTTP/1.1 requests on their own
connections (``POST /agent/wait``, the three agent headers, ``{"timeout_ms": N}``), like Claude Code's
hook waiters do.

- ``wake_p50_ms`` / ``wake_p99_ms``: 100 waiters parked (100 agents); one at a time, the bench sends an
  envelope to one of them through relay's core and times send -> that waiter's answer read; the waiter
  parks again.
- ``idle_waiters``: on a second, fresh worker, waiters parked at once (its ``csf_relay_long_polls_parked``
  gauge, read last), one per agent; ``idle_waiter_kib``: the worker's RSS growth per parked waiter (RSS
  after one warm-up wait and once its CPU is quiet, against RSS with all of them parked and the worker
  quiet again); ``idle_redis_conns``: the worker's connections in Redis's ``CLIENT LIST`` meanwhile
  (matched by the worker's own socket addresses).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.front.key_file import load_key_file
from broker.front.paths import WAIT_PATH
from broker.front.tokens import agent_headers, generate_key
from broker.relay import Relay
from relay.http_limits import allow_open_files

try:
    from bench.wake_clis import cli_wake_figures
except ImportError:  # run as a script from bench/
    from wake_clis import cli_wake_figures  # type: ignore[no-redef]

LATENCY_WAITERS = 100
IDLE_TIMEOUT_MS = 290_000
"""Long enough to outlast the idle phase, under the route's 300 s cap."""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def socket_addresses(pid: int, remote_port: int) -> set[str]:
    """``ip:port`` of ``pid``'s TCP sockets connected to ``remote_port`` (from /proc, IPv4 loopback)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        local, remote, inode = parts[1], parts[2], parts[9]
        if inode in inodes and int(remote.split(":")[1], 16) == remote_port:
            ip_hex, port_hex = local.split(":")
            ip = ".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
            found.add(f"{ip}:{int(port_hex, 16)}")
    return found


class Waiter:
    """One ``POST /agent/wait`` on its own connection."""

    def __init__(self, port: int, headers: dict[str, str], timeout_ms: int) -> None:
        body = json.dumps({"timeout_ms": timeout_ms}).encode()
        head = [f"POST {WAIT_PATH} HTTP/1.1", f"host: 127.0.0.1:{port}", "connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head += ["content-type: application/json", f"content-length: {len(body)}", "", ""]
        self.request = "\r\n".join(head).encode() + body
        self.port = port
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.request)
        await self.writer.drain()

    async def answer(self) -> dict[str, Any]:
        assert self.reader is not None and self.writer is not None
        raw = await self.reader.read()
        self.writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"wait refused: {head[:200]!r} {body[:300]!r}")
        answer: dict[str, Any] = json.loads(body)
        return answer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Worker:
    """One ``relay serve`` process on ``redis_url``."""

    def __init__(self, redis_url: str, key_file: Path, port: int, connections: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "relay", "serve", "--redis-url", redis_url, "--port", str(port)]
        cmd += ["--agent-mcp-key-file", str(key_file), "--log-level", "warning"]
        cmd += ["--max-connections", str(connections)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.base}/readyz", timeout=1) as reply,  # noqa: S310
            ):
                if reply.status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("worker not ready")

    def parked(self) -> int:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as reply:  # noqa: S310
            for line in reply.read().decode().splitlines():
                if line.startswith("csf_relay_long_polls_parked "):
                    return int(float(line.split()[1]))
        return -1

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _until(condition: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {within} s: {what}")
        await asyncio.sleep(0.1)


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until_quiet(pid: int, within: float = 120.0) -> None:
    """Until ``pid`` used under 2% of a core over a second, twice in a row (every waiter parked)."""
    deadline, quiet, last = time.monotonic() + within, 0, proc_cpu(pid)
    while quiet < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"worker {pid} still busy after {within} s")
        await asyncio.sleep(1.0)
        now = proc_cpu(pid)
        quiet = quiet + 1 if now - last < 0.02 else 0
        last = now


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def wake_figures(redis_url: str, *, idle: int = 10_000, samples: int = 300) -> dict[str, Any]:
    """Run the two phases against a fresh worker on ``redis_url``; the figures as a dict."""
    connections = LATENCY_WAITERS + idle + 100
    allow_open_files(connections)  # the bench's client sockets; the workers inherit the limit
    tmp = Path(tempfile.mkdtemp(prefix="relay-wake-"))
    key_file = tmp / "relay.key"
    key_file.write_text(generate_key() + "\n")
    key_file.chmod(0o600)
    keyring = load_key_file(key_file)
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with socket_port() as port:
        worker = Worker(redis_url, key_file, port, connections)
    with socket_port() as idle_port:
        idle_worker = Worker(redis_url, key_file, idle_port, connections)
    connection = RedisConnection(RedisSettings(url=redis_url))
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        notices=RedisNoticeStore(connection),
    )
    run = secrets.token_hex(3)
    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    waiters: list[Waiter] = []
    try:
        await asyncio.to_thread(worker.wait_ready)
        await asyncio.to_thread(idle_worker.wait_ready)
        async with relay:
            agents = [f"wake-{run}-{i}" for i in range(LATENCY_WAITERS + idle)]
            for chunk in range(0, len(agents), 500):
                await asyncio.gather(
                    *(relay.register(a, address, f"s-{a}") for a in agents[chunk : chunk + 500])
                )
            await relay.register(f"wake-{run}-sender", address, "s-sender")
            headers = {a: agent_headers(keyring, a, f"s-{a}", 3600) for a in agents}
            note = AgentMessage(kind=Kind.KIND_NOTE, text="wake up")

            # wake latency: 100 parked waiters, one send at a time
            hot = agents[:LATENCY_WAITERS]
            parked = {a: Waiter(port, headers[a], 60_000) for a in hot}
            await asyncio.gather(*(w.start() for w in parked.values()))
            await _until(lambda: worker.parked() >= LATENCY_WAITERS, 30, "100 waiters parked")
            took: list[float] = []
            for _ in range(samples):
                agent = random.choice(hot)
                waiter = parked[agent]
                started = time.perf_counter()
                await relay.send(f"wake-{run}-sender", agent, note)
                answer = await asyncio.wait_for(waiter.answer(), 10)
                took.append((time.perf_counter() - started) * 1000)
                assert answer["count"] == 1, answer
                parked[agent] = Waiter(port, headers[agent], 60_000)
                await parked[
                    agent
                ].start()  # parked by the time its agent is picked again, or it finds the mail
            for waiter in parked.values():
                waiter.close()

            # idle waiters, on a worker of their own (its pools hold only what the waiters made it open)
            warm = Waiter(idle_port, headers[hot[0]], 0)
            await warm.start()
            await warm.answer()
            await _until_quiet(idle_worker.proc.pid)
            before = rss_kib(idle_worker.proc.pid)
            idle_agents = agents[LATENCY_WAITERS:]
            gate = asyncio.Semaphore(256)

            async def park(agent: str) -> None:
                async with gate:
                    waiter = Waiter(idle_port, headers[agent], IDLE_TIMEOUT_MS)
                    await waiter.start()
                    waiters.append(waiter)

            await asyncio.gather(*(park(a) for a in idle_agents))
            await _until_quiet(idle_worker.proc.pid)
            after = rss_kib(idle_worker.proc.pid)
            mine = socket_addresses(idle_worker.proc.pid, redis_port)
            monitor = Redis.from_url(redis_url, decode_responses=True)
            try:
                clients = await monitor.client_list()
            finally:
                await monitor.aclose()
            conns = sum(1 for c in clients if c.get("addr") in mine)
            held = await asyncio.to_thread(idle_worker.parked)  # after counting: a scrape opens connections
    finally:
        for waiter in waiters:
            waiter.close()
        worker.stop()
        idle_worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "wake_p50_ms": round(_percentile(took, 0.50), 2),
        "wake_p99_ms": round(_percentile(took, 0.99), 2),
        "wake_samples": len(took),
        "idle_waiters": held,
        "idle_waiter_kib": round((after - before) / max(held, 1), 2),
        "idle_redis_conns": conns,
    }


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port


async def _main(args: argparse.Namespace) -> int:
    from adapters.redis.embedded import EmbeddedRedis

    tmp = Path(tempfile.mkdtemp(prefix="relay-wake-redis-"))
    server = EmbeddedRedis(tmp, appendfsync="everysec")
    server.start()
    try:
        figures = (
            {} if args.clis_only else await wake_figures(server.url, idle=args.idle, samples=args.samples)
        )
        if args.cli_samples > 0:
            figures |= await asyncio.to_thread(cli_wake_figures, server.url, samples=args.cli_samples)
    finally:
        server.stop()
    print("relay-wake " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=10_000, help="idle waiters to park (default 10000)")
    parser.add_argument("--samples", type=int, default=300, help="wake latency samples (default 300)")
    parser.add_argument(
        "--cli-samples", type=int, default=20, help="sends per coding-agent CLI path (default 20; 0: none)"
    )
    parser.add_argument("--clis-only", action="store_true", help="only the coding-agent CLI paths")
    sys.exit(asyncio.run(_main(parser.parse_args())))
