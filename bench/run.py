"""relay's benchmark: relay against raw Redis and against the MCP ceiling, in one run on one machine.

    python bench/run.py            # full run, under 3 minutes
    python bench/run.py --quick    # shorter phases, under a minute
    python bench/run.py --only mcp # one part (or several: --only core,mcp)
    python bench/run.py --only mcp --compare main   # this code against a git ref, alternating runs

It starts its own Redis-protocol server (``EmbeddedRedis``: the redis-server ``relay serve`` would use,
append-only with ``appendfsync everysec`` like ``relay serve``) on a free loopback port and measures:

(a) raw: redis-py asyncio without relay, ``XADD`` -> ``XREADGROUP`` -> ``XACK`` per message.
(b) relay's core through its Python API: ``send`` -> ``fetch`` -> ``ack``, one message at a time and
    batched (16 sends, one fetch with limit 16, one ack of all of them), memory and Redis backends, at
    concurrency 1 and 16 (each concurrent loop is its own pair of agents, like (a)'s own stream); and
    one at a time on Redis with a contact policy set (each recipient accepts a list of 1,000 ids that
    names its sender): ``core_ratio_policy`` next to ``core_ratio`` (docs/policy.md).
(c) relay over MCP HTTP with the official ``mcp`` client against ``relay serve`` workers (one, then two
    sharing the Redis), 1 and 16 agents, clients in their own processes; per message one
    ``SendAgentMessage``, and per 16 messages one ``FetchAgentInbox`` (limit 16) and one
    ``AcknowledgeAgentInbox``. The ceiling: a no-op tool on the same workers, same agents, same clients.
rules: ``redis_us_per_msg`` (Redis CPU per message of (b) one at a time at c16, every delivery rule on at
    ``relay serve``'s defaults) and what each rule costs, one rule off at a time in interleaved rounds
    (``bench/rules.py``).
server CPU: ``server_cpu_ms_per_msg`` (worker + Redis CPU per message, send -> fetch -> ack one at a
    time over MCP, 8 JSON-RPC clients; ``bench/server_cpu.py``), part of the MCP phases.
memory: Redis bytes per queued envelope (300-byte text) against a raw 300-byte stream entry.
network: the network listener's figures (``bench/network.py``): ``webhook_p99_ms`` (send -> verified
    webhook notification, 100 remote agents, 20 envelopes/s offered; ``webhook_saturated_p99_ms`` beside
    it) and ``mcp_tls_ratio`` (MCP calls over TLS / plain loopback).
--cluster: the core and MCP phases on a local 3-master cluster, with msgs/s per master and Redis CPU per
    message summed over the masters (docs/performance.md's sizing table).
people: ``relay agents`` with 1,000 registered agents and 100,000 queued envelopes (``bench/people.py``).
wake: the mail-pending wait (``bench/wake.py``): send -> waiter answered with 100 waiters parked
    (``wake_p50_ms``, ``wake_p99_ms``), and 10,000 idle waiters on one worker (``idle_waiters``,
    ``idle_waiter_kib`` of worker RSS each, ``idle_redis_conns``); ``--quick`` parks 2,000.
credentials: a per-agent credential's costs (``bench/credentials.py``): ``token_exchange_ms_p50`` /
    ``_p99`` (``POST /agent/token``), a call with an exchanged token against a key-minted one, and
    ``relay hook headers`` as Claude Code runs it.
workbench: 8 agent SDK sessions (``bench/workbench.py``): send -> prompt handed to the session
    (``workbench_prompt_p50_ms``, ``_p99_ms``), idle RSS per session of each runtime, and
    ``workbench_lost`` (0) with session CLIs SIGKILLed mid-stream; skipped without the SDKs.
history: a thread of 6 read among 1,000,000 stored envelopes, a search over a day of 100,000,
    bytes per archived envelope and ``core_ratio_history`` (``bench/history.py``); ``--quick``: 100,000.

Every relay message carries a unique id in its text; the bench counts deliveries per id and reports
lost (sent but never acknowledged) and duplicated (delivered again after its acknowledgement) messages.
The last line starts with ``relay-bench`` and holds the figures as key=value pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import people  # bench/people.py: `python bench/run.py` puts bench/ first on the path
from redis.asyncio import Redis, RedisCluster

from adapters.memory import MemoryInboxStore, MemoryPolicyStore, MemoryRegistry, MemoryState
from adapters.redis import (
    GROUP,
    RedisConnection,
    RedisInboxStore,
    RedisPolicyStore,
    RedisRegistry,
    RedisSettings,
)
from adapters.redis.embedded import EmbeddedRedis
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.front.tokens import generate_key
from broker.limits import DEFAULT_MAX_DELIVERIES, MAX_POLICY_AGENTS
from broker.policy import listing
from broker.ports import IPolicyStore
from broker.relay import Relay
from tests.cluster_support import LocalCluster

try:
    from bench.wake import LATENCY_WAITERS, wake_figures
except ModuleNotFoundError:  # run as a script: bench/ is on the path, not the repository root
    from wake import LATENCY_WAITERS, wake_figures  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
BATCH = 16
TEXT_BYTES = 300
CONCURRENCIES = (1, 16)
MCP_CONFIGS = ((1, 1), (16, 1), (1, 2), (16, 2))  # (agents, workers)


# -- measurements ----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


@dataclass
class Result:
    name: str
    messages: int
    elapsed: float
    latency: list[float] = field(default_factory=list)
    """Seconds from a message's send to its acknowledgement (raw: the XADD..XACK cycle)."""
    calls: int = 0
    call_latency: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    redis_cpu: float = 0.0
    redis_command_us: float = 0.0
    """Microseconds of script execution over the phase (``redis_command_us``)."""
    lost: int = 0
    duplicated: int = 0
    median_rate: float = 0.0
    median_call_rate: float = 0.0
    window: float = 0.0
    """MCP phases: the measured window (seconds); the call rate counts only calls completed in it.
    (The message rate keeps every message over the whole phase, drain included: end to end.)"""
    window_calls: int = 0

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed if self.elapsed else 0.0

    @property
    def call_rate(self) -> float:
        if self.window:
            return self.window_calls / self.window
        return self.calls / self.elapsed if self.elapsed else 0.0

    def row(self) -> str:
        p50, p99 = percentile(self.latency, 50) * 1000, percentile(self.latency, 99) * 1000
        cpu = ""
        if self.messages:
            per = 1e6 / self.messages
            cpu = f"client {self.client_cpu * per:5.0f}"
            if self.server_cpu:
                cpu += f"  workers {self.server_cpu * per:5.0f}"
            cpu += f"  redis {self.redis_cpu * per:4.0f}"
        rate = self.median_rate or self.rate
        return f"{self.name:<34} {rate:9.0f} msg/s  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  cpu µs/msg: {cpu}"


def text_for(uid: str) -> str:
    head = f"bench {uid} "
    return head + "x" * (TEXT_BYTES - len(head))


def uid_of(text: str) -> str:
    return text.split(" ", 2)[1]


async def redis_cpu(client: Redis | list[Redis]) -> float:
    """CPU seconds the server used so far (summed over every master of a cluster)."""
    total = 0.0
    for one in client if isinstance(client, list) else [client]:
        info = await one.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


async def redis_command_us(client: Redis | list[Redis]) -> float:
    """Microseconds the server spent running scripts so far (``INFO commandstats`` of ``FCALL`` and
    ``EVAL``, every master): the scripts' work without the network I/O around them, which pipelining
    changes. (Commands a script calls are counted in their own rows as well: not summed again.)"""
    total = 0.0
    for one in client if isinstance(client, list) else [client]:
        info = await one.info("commandstats")
        total += sum(float(info[k]["usec"]) for k in ("cmdstat_fcall", "cmdstat_eval") if k in info)
    return total


async def timed(
    name: str,
    concurrency: int,
    duration: float,
    loop: Callable[[int, float, Result], Awaitable[None]],
    monitor: Redis | list[Redis],
) -> Result:
    """Run ``loop(k, deadline, result)`` for k in 0..concurrency-1 until the deadline; count CPU."""
    result = Result(name, 0, 0.0)
    command0 = await redis_command_us(monitor)
    redis0, cpu0 = await redis_cpu(monitor), time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(loop(k, start + duration, result) for k in range(concurrency)))
    result.elapsed = time.perf_counter() - start
    result.client_cpu = time.process_time() - cpu0
    result.redis_cpu = await redis_cpu(monitor) - redis0
    result.redis_command_us = await redis_command_us(monitor) - command0
    return result


# -- (a) raw redis-py ------------------------------------------------------------------------------


async def raw_baseline(
    url: str, concurrency: int, duration: float, monitor: Redis | list[Redis], *, cluster: bool = False
) -> Result:
    client: Redis | RedisCluster = (
        RedisCluster.from_url(url, decode_responses=True)
        if cluster
        else Redis.from_url(url, decode_responses=True)
    )
    tag = secrets.token_hex(3)
    keys = [f"raw:{tag}:inbox:{{agent{k}}}" for k in range(concurrency)]
    for key in keys:
        await client.xgroup_create(key, GROUP, id="0", mkstream=True)
    text = text_for("raw")

    async def cycle(k: int, result: Result) -> None:
        t0 = time.perf_counter()
        await client.xadd(keys[k], {"body": text})
        reply = await client.xreadgroup(GROUP, f"agent{k}", {keys[k]: ">"}, count=1)
        entry_id = (reply[keys[k]][0] if isinstance(reply, dict) else reply[0][1])[0][0]
        await client.xack(keys[k], GROUP, entry_id)
        result.latency.append(time.perf_counter() - t0)
        result.messages += 1

    async def loop(k: int, deadline: float, result: Result) -> None:
        while time.perf_counter() < deadline:
            await cycle(k, result)

    try:
        warm = Result("warm", 0, 0)
        await asyncio.gather(*(cycle(k, warm) for k in range(concurrency)))
        return await timed(f"(a) raw redis-py, c{concurrency}", concurrency, duration, loop, monitor)
    finally:
        await client.delete(*keys)
        await client.aclose()


# -- (b) relay core --------------------------------------------------------------------------------


RULES_ON: dict[str, Any] = {"max_deliveries": DEFAULT_MAX_DELIVERIES}
"""RedisSettings of the core phases: ``relay serve``'s defaults (status, history, the idempotency
window and the poison limit on; RedisSettings' own ``max_deliveries`` default is 0)."""


@contextlib.asynccontextmanager
async def core_relay(backend: str, url: str, settings: dict[str, Any] | None = None) -> Any:
    """A started relay on ``backend`` and the contact-policy store of the same backend; ``settings``
    (RedisSettings fields, Redis only) replace ``RULES_ON``."""
    policies: IPolicyStore
    if backend == "memory":
        state = MemoryState(max_deliveries=DEFAULT_MAX_DELIVERIES)
        relay = Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state))
        policies = MemoryPolicyStore(state)
    else:
        chosen = RULES_ON if settings is None else settings
        connection = RedisConnection(RedisSettings(url=url, prefix=f"bench{secrets.token_hex(3)}", **chosen))
        relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
        policies = RedisPolicyStore(connection)
    async with relay:
        yield relay, policies


async def core_bench(
    backend: str,
    batched: bool,
    url: str,
    concurrency: int,
    duration: float,
    monitor: Redis | list[Redis],
    *,
    policy: bool = False,
    settings: dict[str, Any] | None = None,
    idempotency: bool = True,
    ttl_ms: int | None = None,
    label: str = "",
) -> Result:
    """The core loop; with ``policy``, every recipient accepts only a list of ``MAX_POLICY_AGENTS`` ids
    that names its sender (docs/policy.md), so each send is checked against a full list. Every send
    names an idempotency key unless ``idempotency`` is False, and carries ``ttl_ms`` when given;
    ``settings`` as ``core_relay``'s."""
    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    mode = label or ("policy, one" if policy else "batched x16" if batched else "one at a time")
    async with core_relay(backend, url, settings) as (relay, policies):
        pairs = [(f"s{k}", f"r{k}") for k in range(concurrency)]
        for sender, recipient in pairs:
            await relay.register(sender, address, f"sess-{sender}")
            await relay.register(recipient, address, f"sess-{recipient}")
            if policy:
                others = (f"x{i}" for i in range(MAX_POLICY_AGENTS - 1))
                await policies.set(recipient, listing([sender, *others]))
        sent_at: dict[str, float] = {}
        acked: set[str] = set()
        counters = {"sent": 0, "seq": 0}

        def count(got: list[Any], done: Any, result: Result, now: float | None) -> None:
            """Tally acknowledged messages (with their latency when ``now`` is given) and duplicates."""
            ok = set(done.acknowledged)
            for envelope in got:
                uid = uid_of(envelope.message.text)
                if uid in acked:
                    result.duplicated += 1
                elif envelope.id in ok:
                    acked.add(uid)
                    result.messages += 1
                    if now is not None:
                        result.latency.append(now - sent_at[uid])

        async def cycle(k: int, result: Result) -> None:
            sender, recipient = pairs[k]
            for _ in range(BATCH if batched else 1):
                counters["seq"] += 1
                uid = f"{k}.{counters['seq']:x}"
                sent_at[uid] = time.perf_counter()
                body = AgentMessage(kind=Kind.KIND_NOTE, text=text_for(uid))
                # every send names an idempotency key, and status keeping is on (the default)
                await relay.send(
                    sender,
                    recipient,
                    body,
                    session=f"sess-{sender}",
                    idempotency_key=uid if idempotency else None,
                    ttl_ms=ttl_ms,
                )
                counters["sent"] += 1
            got = await relay.fetch(recipient, BATCH if batched else 1, session=f"sess-{recipient}")
            done = await relay.ack(recipient, [e.id for e in got], session=f"sess-{recipient}")
            count(got, done, result, time.perf_counter())

        async def loop(k: int, deadline: float, result: Result) -> None:
            while time.perf_counter() < deadline:
                await cycle(k, result)
            # drain: everything sent to this recipient must come back exactly once
            for _ in range(1000):
                got = await relay.fetch(pairs[k][1], BATCH, session=f"sess-{pairs[k][1]}")
                if not got:
                    break
                done = await relay.ack(pairs[k][1], [e.id for e in got], session=f"sess-{pairs[k][1]}")
                count(got, done, result, None)

        warm = Result("warm", 0, 0)
        await asyncio.gather(*(cycle(k, warm) for k in range(concurrency)))
        base = counters["sent"]
        name = f"(b) core {backend:<6} {mode}, c{concurrency}"
        result = await timed(name, concurrency, duration, loop, monitor)
        result.lost = counters["sent"] - base - result.messages
        return result


# -- memory ----------------------------------------------------------------------------------------


async def memory_per_envelope(url: str, count: int, monitor: Redis) -> tuple[float, float]:
    """(relay bytes, raw bytes) per queued envelope with a 300-byte text.

    ``MEMORY USAGE key SAMPLES 0`` (every stream node counted) of one inbox after one envelope and
    after ``count`` more, relay's inbox against a raw stream with a consumer group and ``body <300
    bytes>`` entries; same server, same stream-node settings. (An ``INFO used_memory`` delta would
    also count the client connections' buffers.)
    """

    async def usage(key: str) -> int:
        return int(await monitor.memory_usage(key, samples=0) or 0)

    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    text = text_for("memory")
    async with core_relay("redis", url) as (relay, _):
        await relay.register("alice", address, "a-1")
        await relay.register("bob", address, "b-1")
        inbox = relay_inbox_key(relay, "bob")
        body = AgentMessage(kind=Kind.KIND_NOTE, text=text)
        await relay.send("alice", "bob", body, session="a-1")
        before = await usage(inbox)
        for start in range(0, count, 64):
            await asyncio.gather(
                *(relay.send("alice", "bob", body, session="a-1") for _ in range(min(64, count - start)))
            )
        relay_bytes = (await usage(inbox) - before) / count
        await monitor.delete(inbox)
    key = f"raw:{secrets.token_hex(3)}:inbox:{{bob}}"
    await monitor.xgroup_create(key, GROUP, id="0", mkstream=True)
    await monitor.xadd(key, {"body": text})
    before = await usage(key)
    pipe = monitor.pipeline(transaction=False)
    for _ in range(count):
        pipe.xadd(key, {"body": text})
    await pipe.execute()
    raw_bytes = (await usage(key) - before) / count
    await monitor.delete(key)
    return relay_bytes, raw_bytes


def relay_inbox_key(relay: Relay[AgentMessage], agent: str) -> str:
    store = relay._inbox  # the bench reads the Redis key of the inbox it measures
    assert isinstance(store, RedisInboxStore)
    return store.keys.inbox(agent)


# -- (c) MCP ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Workers:
    """``relay serve`` worker processes (with the bench-only NoOp tool) sharing the bench's Redis."""

    def __init__(self, redis_url: str | list[str], key_file: Path, count: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        redis_urls = [redis_url] if isinstance(redis_url, str) else redis_url
        for i in range(count):
            port = free_port()
            where = redis_urls[i % len(redis_urls)]
            cmd = [sys.executable, str(HERE / "noop_worker.py"), "serve", "--redis-url", where]
            cmd += ["--port", str(port), "--agent-mcp-key-file", str(key_file), "--log-level", "warning"]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL))
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for proc, base in zip(self.procs, self.urls, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"worker {base} exited with {proc.returncode}")
                try:
                    with urllib.request.urlopen(f"{base}/readyz", timeout=1) as reply:  # noqa: S310
                        if reply.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {base} not ready after {timeout}s")
                time.sleep(0.05)

    def cpu(self) -> float:
        return sum(proc_cpu(p.pid) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def mcp_row(relay: Result, ceiling: Result, ratio: float) -> str:
    c50, c99 = (percentile(relay.call_latency, q) * 1000 for q in (50, 99))
    n50, n99 = (percentile(ceiling.call_latency, q) * 1000 for q in (50, 99))

    def per_call(result: Result) -> str:
        if not result.calls:
            return ""
        client, server = (result.client_cpu / result.calls * 1e6, result.server_cpu / result.calls * 1e6)
        return f"cpu µs/call: client {client:4.0f} workers {server:4.0f}"

    return (
        f"{'':<34} {relay.median_call_rate:7.0f} calls/s (p50 {c50:6.2f} p99 {c99:6.2f} ms, "
        f"{per_call(relay)})  ceiling {ceiling.median_call_rate:7.0f} calls/s "
        f"(p50 {n50:6.2f} p99 {n99:6.2f} ms, {per_call(ceiling)})  ratio {ratio:.2f}"
    )


class Clients:
    """The MCP client processes of one configuration: ``agents`` agents spread over ``nworkers`` workers.

    Agent ``i`` talks to worker ``i % nworkers`` and sends to agent ``i ^ 1`` (its partner; itself when
    alone). Partners live in the same client process, so every message's latency is measured on one
    clock. The processes stay up for every round of the configuration.
    """

    def __init__(self, agents: int, nworkers: int) -> None:
        self.agents = agents
        self.nworkers = nworkers
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, workers: Workers, key_file: Path, client_procs: int, mode: str) -> None:
        tag = f"a{self.agents}w{self.nworkers}x{secrets.token_hex(2)}"
        names = [f"{tag}-{i:02d}" for i in range(self.agents)]
        specs = []
        for i, name in enumerate(names):
            partner = names[i ^ 1] if (i ^ 1) < self.agents else name
            specs.append([name, workers.urls[i % self.nworkers] + "/mcp/agent", partner])
        nproc = max(1, min(client_procs, self.agents // 2))
        per = -(-self.agents // nproc)
        for p in range(nproc):
            mine = specs[p * per : (p + 1) * per]
            job = {"agents": mine, "key_file": str(key_file), "mode": mode, "run": tag}
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(HERE / "mcp_load.py"),
                    json.dumps(job),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    limit=64 * 1024 * 1024,
                )
            )
        for proc in self.procs:
            if not (await self._read(proc, 60)).get("ready"):
                raise RuntimeError("an MCP client process did not get ready")

    @staticmethod
    async def _read(proc: asyncio.subprocess.Process, seconds: float) -> dict[str, Any]:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), seconds)
        if not line:
            raise RuntimeError(f"MCP client process exited with {await proc.wait()}")
        data: dict[str, Any] = json.loads(line)
        return data

    async def run(
        self, phase: str, duration: float, workers: Workers, monitor: Redis | list[Redis]
    ) -> Result:
        redis0, workers0 = await redis_cpu(monitor), workers.cpu()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{phase} {duration}\n".encode())
            await proc.stdin.drain()
        outs = [await self._read(proc, duration + 90) for proc in self.procs]
        label = "ceiling: NoOp tool" if phase == "noop" else "(c) relay over MCP"
        result = Result(f"{label}, {self.agents}a {self.nworkers}w", 0, max(o["elapsed"] for o in outs))
        result.server_cpu = workers.cpu() - workers0
        result.redis_cpu = await redis_cpu(monitor) - redis0
        result.window = max(o["window"] for o in outs)
        for out in outs:
            result.window_calls += out["window_calls"]
            result.calls += out["calls"]
            result.call_latency += out["call_latency"]
            result.latency += out["msg_latency"]
            result.client_cpu += out["cpu"]
            result.duplicated += out["duplicated"]
            if phase == "relay":
                result.messages += out["acked"]
                result.lost += out["sent"] - out["acked"]
            for error in out["errors"]:
                print(f"  client error: {error}", file=sys.stderr)
        if phase == "noop":
            result.latency = result.call_latency
        return result

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None and proc.stdin is not None:
                proc.stdin.write(b"quit\n")
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# -- rounds ----------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def merged(rounds: list[Result]) -> Result:
    """One result from several rounds of the same measurement: the median rate, pooled latencies."""
    first = rounds[0]
    out = Result(first.name, 0, 0.0)
    for r in rounds:
        out.messages += r.messages
        out.calls += r.calls
        out.elapsed += r.elapsed
        out.latency += r.latency
        out.call_latency += r.call_latency
        out.client_cpu += r.client_cpu
        out.server_cpu += r.server_cpu
        out.redis_cpu += r.redis_cpu
        out.lost += r.lost
        out.duplicated += r.duplicated
    # report the median round's rate (robust against a burst of load from elsewhere on the machine)
    rate = median([r.rate for r in rounds])
    call_rate = median([r.call_rate for r in rounds])
    out.median_rate, out.median_call_rate = rate, call_rate
    return out


def redis_us(result: Result) -> float:
    """Redis CPU per message of ``result`` in µs."""
    return round(result.redis_cpu / result.messages * 1e6, 1) if result.messages else 0.0


def ratio(rounds: list[Result], baselines: list[Result], calls: bool = False) -> float:
    """Median over rounds of (rate / baseline rate), each pair measured back to back."""
    pairs = [
        (r.call_rate / b.call_rate) if calls else (r.rate / b.rate)
        for r, b in zip(rounds, baselines, strict=True)
        if (b.call_rate if calls else b.rate)
    ]
    return median(pairs) if pairs else 0.0


# -- a local Redis Cluster ------------------------------------------------------------------------


async def cluster_phases(
    args: argparse.Namespace, rounds: int, duration: float, mcp_duration: float, key_file: Path
) -> tuple[dict[str, Any], list[Result]]:
    """The core (relay's Redis backend and raw redis-py) and MCP phases on a local 3-master cluster
    without replicas; Redis CPU is summed over the masters."""
    figures: dict[str, Any] = {}
    all_rounds: list[Result] = []
    cluster = LocalCluster(masters=3, replicas=0)
    cluster.start()
    monitors = [Redis.from_url(url, decode_responses=True) for url in cluster.urls]
    workers: Workers | None = None
    clients: Clients | None = None
    print(f"# local Redis Cluster: 3 masters on {', '.join(cluster.urls)}", flush=True)
    try:
        for c in () if args.skip_core else CONCURRENCIES:
            per: dict[str, list[Result]] = {"raw": []}
            for _ in range(rounds):
                per["raw"].append(await raw_baseline(cluster.url, c, duration, monitors, cluster=True))
                for batched, policy in ((False, False), (True, False), (False, True)):
                    r = await core_bench("redis", batched, cluster.url, c, duration, monitors, policy=policy)
                    key = ("batch" if batched else "one") + ("_policy" if policy else "")
                    per.setdefault(key, []).append(r)
            for key, rs in per.items():
                all_rounds += rs
                m = merged(rs)
                m.name = "[cluster] " + m.name
                suffix = "" if key == "raw" else f"  x{ratio(rs, per['raw']):.2f} raw c{c}"
                print(m.row() + suffix, flush=True)
                if key != "raw":
                    figures[f"cluster_{key}_c{c}_ratio"] = round(ratio(rs, per["raw"]), 2)
                if c == 16 and m.messages:
                    # sizing (docs/performance.md): Redis CPU summed over the masters, rate per master
                    figures[f"cluster_{key}_redis_us_per_msg"] = round(m.redis_cpu / m.messages * 1e6, 1)
                    figures[f"cluster_{key}_msgs_per_s_per_master"] = round(m.median_rate / len(monitors))
        if not args.skip_mcp:
            workers = Workers(cluster.urls[:2], key_file, 2)
            workers.wait_ready()
            for agents, nworkers in ((16, 2),):
                clients = Clients(agents, nworkers)
                await clients.start(workers, key_file, args.client_procs, args.mode)
                relay_rounds, noop_rounds = [], []
                for _ in range(rounds):
                    relay_rounds.append(await clients.run("relay", mcp_duration, workers, monitors))
                    noop_rounds.append(await clients.run("noop", mcp_duration, workers, monitors))
                await clients.stop()
                clients = None
                all_rounds += relay_rounds
                relay_r, noop_r = merged(relay_rounds), merged(noop_rounds)
                relay_r.name = "[cluster] " + relay_r.name
                mcp = ratio(relay_rounds, noop_rounds, calls=True)
                print(relay_r.row(), flush=True)
                print(mcp_row(relay_r, noop_r, mcp), flush=True)
                figures[f"cluster_mcp_{nworkers}w_{agents}a_msgs_per_s"] = round(relay_r.median_rate)
                figures[f"cluster_mcp_ratio_{agents}a{nworkers}w"] = round(mcp, 2)
    finally:
        if clients is not None:
            await clients.stop()
        if workers is not None:
            workers.stop()
        for monitor in monitors:
            await monitor.aclose()
        cluster.stop()
    return figures, all_rounds


# -- main ------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace) -> int:
    quick = args.quick
    rounds = args.rounds or (2 if quick else 3)
    duration = args.duration or (0.75 if quick else 2.0)
    mcp_duration = args.mcp_duration or (1.5 if quick else 3.5)
    mem_count = 5000 if quick else 20000
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    server = EmbeddedRedis(tmp / "redis", appendfsync="everysec")
    server.start()
    print(
        f"# relay-bench on {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{'uvloop' if args.uvloop else 'asyncio'} event loop in the bench and client processes; "
        f"{rounds} interleaved rounds per figure ({duration:g} s core, {mcp_duration:g} s MCP), median"
    )
    print(f"# {server.describe()}")
    monitor = Redis.from_url(server.url, decode_responses=True)
    results: dict[str, Result] = {}
    figures: dict[str, Any] = {}
    all_rounds: list[Result] = []
    workers: Workers | None = None
    clients: Clients | None = None
    try:
        core_configs = [(b, batched, False) for b in ("redis", "memory") for batched in (False, True)]
        core_configs.append(("redis", False, True))  # core_ratio_policy: the same loop, a policy set
        for c in () if args.skip_core else CONCURRENCIES:
            per: dict[str, list[Result]] = {"raw": []}
            for _ in range(rounds):
                per["raw"].append(await raw_baseline(server.url, c, duration, monitor))
                for backend, batched, policy in core_configs:
                    key = f"{backend}_{'batch' if batched else 'one'}{'_policy' if policy else ''}"
                    r = await core_bench(backend, batched, server.url, c, duration, monitor, policy=policy)
                    per.setdefault(key, []).append(r)
            for key, rs in per.items():
                all_rounds += rs
                results[f"{key}_c{c}"] = m = merged(rs)
                suffix = "" if key == "raw" else f"  x{ratio(rs, per['raw']):.2f} raw c{c}"
                print(m.row() + suffix, flush=True)
                if key != "raw":
                    figures[f"{key}_c{c}_ratio"] = round(ratio(rs, per["raw"]), 2)
        if not args.skip_core:
            from rules import rule_costs  # bench/rules.py

            found, rule_rounds = await rule_costs(
                core_bench, server.url, max(rounds, 3), max(duration, 1.5), monitor
            )
            figures.update(found)
            all_rounds += rule_rounds
            relay_bytes, raw_bytes = await memory_per_envelope(server.url, mem_count, monitor)
            print(
                f"memory per queued envelope (300-byte text, {mem_count} queued): relay {relay_bytes:.0f} B, "
                f"raw stream entry {raw_bytes:.0f} B, ratio {relay_bytes / raw_bytes:.2f}",
                flush=True,
            )
            figures["mem_relay_bytes"] = round(relay_bytes)
            figures["mem_raw_bytes"] = round(raw_bytes)
            figures["mem_ratio"] = round(relay_bytes / raw_bytes, 2)

        if not args.skip_mcp:
            key_file = tmp / "relay.key"
            key_file.write_text(generate_key() + "\n")
            key_file.chmod(0o600)
            workers = Workers(server.url, key_file, 2)
            workers.wait_ready()
            mcp_ratios = {}
            for agents, nworkers in MCP_CONFIGS:
                clients = Clients(agents, nworkers)
                await clients.start(workers, key_file, args.client_procs, args.mode)
                relay_rounds, noop_rounds = [], []
                for _ in range(rounds):
                    relay_rounds.append(await clients.run("relay", mcp_duration, workers, monitor))
                    noop_rounds.append(await clients.run("noop", mcp_duration, workers, monitor))
                await clients.stop()
                clients = None
                all_rounds += relay_rounds
                relay_r, noop_r = merged(relay_rounds), merged(noop_rounds)
                config = f"{agents}a{nworkers}w"
                results[f"mcp_{config}"], results[f"noop_{config}"] = relay_r, noop_r
                mcp_ratios[config] = ratio(relay_rounds, noop_rounds, calls=True)
                print(relay_r.row(), flush=True)
                print(mcp_row(relay_r, noop_r, mcp_ratios[config]), flush=True)
                figures[f"mcp_{nworkers}w_{agents}a_msgs_per_s"] = round(relay_r.median_rate)
                figures[f"mcp_{nworkers}w_{agents}a_calls_per_s"] = round(relay_r.median_call_rate)
                figures[f"ceiling_{nworkers}w_{agents}a_calls_per_s"] = round(noop_r.median_call_rate)
                figures[f"mcp_ratio_{config}"] = round(mcp_ratios[config], 2)
                if relay_r.calls and noop_r.calls:
                    # target: relay's worker CPU per tool call within 100 µs of the NoOp's
                    gap = (relay_r.server_cpu / relay_r.calls - noop_r.server_cpu / noop_r.calls) * 1e6
                    figures[f"mcp_worker_gap_us_{config}"] = round(gap)
            figures["mcp_ceiling_ratio"] = round(min(mcp_ratios.values()), 2)
            from server_cpu import server_cpu_figures  # bench/server_cpu.py

            found = await server_cpu_figures(workers, key_file, monitor, redis_cpu, rounds, mcp_duration)
            figures.update(found)
        if not args.skip_network:
            from network import network_phases  # bench/network.py: this script's directory is on sys.path

            figures.update(await network_phases(server.url, tmp, rounds, mcp_duration))
        if not args.skip_people:
            figures.update(await people.bench_agents())
        if not args.skip_wake:
            wake = await wake_figures(
                server.url, idle=2000 if quick else 10_000, samples=100 if quick else 300
            )
            print(
                f"wake: send -> waiter p50 {wake['wake_p50_ms']} ms, p99 {wake['wake_p99_ms']} ms "
                f"({LATENCY_WAITERS} waiters, {wake['wake_samples']} sends); {wake['idle_waiters']} idle "
                f"waiters on one worker: {wake['idle_waiter_kib']} KiB RSS each, "
                f"{wake['idle_redis_conns']} Redis connections",
                flush=True,
            )
            figures.update({k: v for k, v in wake.items() if k != "wake_samples"})
        if not args.skip_credentials:
            from credentials import credential_figures  # bench/credentials.py

            figures.update(await credential_figures(server.url, samples=100 if quick else 300))
        if not args.skip_workbench:
            from workbench import workbench_figures  # bench/workbench.py

            figures.update(await workbench_figures(server.url, samples=80 if quick else 200))
        if not args.skip_history:
            from history import describe, history_figures  # bench/history.py

            found = await history_figures(server.url, 100_000 if quick else 1_000_000, rounds, duration)
            print(describe(found), flush=True)
            lost, duplicated = found.pop("history_lost"), found.pop("history_duplicated")
            all_rounds.append(Result("history", 0, 0.0, lost=lost, duplicated=duplicated))
            figures.update(found)
        if args.cluster:
            key_file = tmp / "relay.key"
            if not key_file.exists():
                key_file.write_text(generate_key() + "\n")
                key_file.chmod(0o600)
            if workers is not None:
                workers.stop()
                workers = None
            found, cluster_rounds = await cluster_phases(args, rounds, duration, mcp_duration, key_file)
            figures.update(found)
            all_rounds += cluster_rounds
    finally:
        if clients is not None:
            await clients.stop()
        if workers is not None:
            workers.stop()
        await monitor.aclose()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    final: dict[str, Any] = {}
    if not args.skip_core:
        final = {
            "core_ratio": figures.pop("redis_one_c16_ratio"),
            "core_ratio_policy": figures.pop("redis_one_policy_c16_ratio"),
            "batched_ratio": figures.pop("redis_batch_c16_ratio"),
            "core_c1_ratio": figures.pop("redis_one_c1_ratio"),
            "core_c1_ratio_policy": figures.pop("redis_one_policy_c1_ratio"),
            "batched_c1_ratio": figures.pop("redis_batch_c1_ratio"),
            "raw_c16_msgs_per_s": round(results["raw_c16"].median_rate),
            "core_c16_msgs_per_s": round(results["redis_one_c16"].median_rate),
            "batched_c16_msgs_per_s": round(results["redis_batch_c16"].median_rate),
            "memory_c16_msgs_per_s": round(results["memory_one_c16"].median_rate),
            # Redis CPU moves less with the machine's load than the rates: read ratios next to these
            "core_c16_redis_us_per_msg": redis_us(results["redis_one_c16"]),
            "batched_c16_redis_us_per_msg": redis_us(results["redis_batch_c16"]),
        }
    for key in [k for k in figures if k.startswith("memory_")]:
        figures.pop(key)
    if "cluster_one_c16_ratio" in figures:
        final["cluster_core_ratio"] = figures.pop("cluster_one_c16_ratio")
        final["cluster_core_ratio_policy"] = figures.pop("cluster_one_policy_c16_ratio")
        final["cluster_batched_ratio"] = figures.pop("cluster_batch_c16_ratio")
    if "redis_us_per_msg" in figures:
        final["redis_us_per_msg"] = figures.pop("redis_us_per_msg")
    if "server_cpu_ms_per_msg" in figures:
        final["server_cpu_ms_per_msg"] = figures.pop("server_cpu_ms_per_msg")
    if "mcp_ceiling_ratio" in figures:
        final["mcp_ceiling_ratio"] = figures.pop("mcp_ceiling_ratio")
        final["mcp_2w_16a_msgs_per_s"] = figures.pop("mcp_2w_16a_msgs_per_s")
    final.update(figures)
    final["lost"] = sum(r.lost for r in all_rounds) + final.pop("server_lost", 0)
    final["duplicated"] = sum(r.duplicated for r in all_rounds) + final.pop("server_duplicated", 0)
    final["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(final, indent=2) + "\n")
    print("relay-bench " + " ".join(f"{k}={v}" for k, v in final.items()), flush=True)
    return 1 if final["lost"] or final["duplicated"] or final.get("workbench_lost") else 0


# -- --compare REF -------------------------------------------------------------------------------

PARTS = ("core", "mcp", "network", "people", "wake", "credentials", "workbench", "history")
"""What ``--only`` picks from; each is a ``--skip-PART`` flag otherwise."""


def child_arguments(argv: list[str], args: argparse.Namespace) -> list[str]:
    """What each run of a comparison gets: ``argv`` without ``--compare``, ``--compare-rounds``,
    ``--json`` and ``--only`` (spelled as the ``--skip-PART`` flags, which older refs know too)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--compare", "--compare-rounds", "--json", "--only"):
            skip = "=" not in arg
            continue
        out.append(arg)
    skips = [f"--skip-{part}" for part in PARTS if getattr(args, f"skip_{part}")]
    return out + [flag for flag in skips if flag not in out]


def figures_ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, float]:
    """Per numeric figure in both, the median over rounds of ours / theirs (runs paired by round)."""
    ratios: dict[str, float] = {}
    for key in ours[0]:
        pairs = [
            o[key] / t[key]
            for o, t in zip(ours, theirs, strict=True)
            if isinstance(o.get(key), int | float)
            and isinstance(t.get(key), int | float)
            and not isinstance(o.get(key), bool)
            and t[key]
        ]
        if pairs:
            ratios[key] = round(median(pairs), 3)
    return ratios


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Run this checkout and ``args.compare`` (a git ref, checked out in a temporary worktree) one
    after the other, ``args.compare_rounds`` times each, alternating (ref first in odd rounds), with
    the same options and Python; print each figure of both and the median ratio this / ref."""
    root = HERE.parent
    ref = args.compare
    tmp = Path(tempfile.mkdtemp(prefix="relay-compare-"))
    tree = tmp / "ref"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), ref], check=True)
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "ref": []}
    try:
        for round_ in range(args.compare_rounds):
            order = ("this", "ref") if round_ % 2 == 0 else ("ref", "this")
            for which in order:
                where = root if which == "this" else tree
                out = tmp / f"{which}-{round_}.json"
                env = {**os.environ, "PYTHONPATH": str(where)}  # the ref's packages shadow the install
                cmd = [
                    sys.executable,
                    str(where / "bench" / "run.py"),
                    *child_arguments(argv, args),
                    "--json",
                    str(out),
                ]
                print(f"# compare round {round_ + 1}/{args.compare_rounds}: {which} ({where})", flush=True)
                done = subprocess.run(cmd, cwd=where, env=env, check=False)
                if done.returncode not in (0, 1) or not out.exists():
                    print(f"# {which} failed with {done.returncode}", file=sys.stderr)
                    return 2
                runs[which].append(json.loads(out.read_text()))
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = figures_ratio(runs["this"], runs["ref"])
    keys = list(dict.fromkeys([*runs["this"][0], *runs["ref"][0]]))  # a figure only one side has: no ratio
    width = max(map(len, keys), default=10)
    print(f"\n{'figure':<{width}}  {'this (each round)':>24}  {ref + ' (each round)':>24}  this/ref")
    for key in keys:
        ours = " ".join(str(r.get(key, "-")) for r in runs["this"])
        theirs = " ".join(str(r.get(key, "-")) for r in runs["ref"])
        shown_ratio = f"{ratios[key]:8.3f}" if key in ratios else f"{'-':>8}"
        print(f"{key:<{width}}  {ours:>24}  {theirs:>24}  {shown_ratio}")
    print(f"relay-bench-compare ref={ref} " + " ".join(f"{k}={v}" for k, v in ratios.items()), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"this": runs["this"], "ref": runs["ref"], "ratio": ratios}, indent=2)
        )
    lost = sum(r.get("lost", 0) + r.get("duplicated", 0) for rs in runs.values() for r in rs)
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases: the whole run takes under 60 s")
    parser.add_argument("--duration", type=float, help="seconds per (a)/(b) round")
    parser.add_argument("--mcp-duration", type=float, help="seconds per (c)/ceiling round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per figure (default 3, --quick 2)")
    parser.add_argument("--client-procs", type=int, default=2, help="MCP client processes (default 2)")
    parser.add_argument("--mode", default="auto", choices=["auto", "legacy"], help="MCP client mode")
    parser.add_argument("--skip-mcp", action="store_true", help="only (a), (b) and memory")
    parser.add_argument("--skip-core", action="store_true", help="only (c) and its ceiling (profiling)")
    parser.add_argument("--skip-network", action="store_true", help="no webhook / MCP-over-TLS figures")
    parser.add_argument(
        "--skip-people", action="store_true", help="not `relay agents` with 1,000 agents (bench/people.py)"
    )
    parser.add_argument("--skip-wake", action="store_true", help="without the mail-pending wait figures")
    parser.add_argument(
        "--skip-credentials", action="store_true", help="without the credential exchange figures"
    )
    parser.add_argument(
        "--skip-workbench", action="store_true", help="without the Workbench figures (8 SDK sessions)"
    )
    parser.add_argument(
        "--skip-history", action="store_true", help="without the history figures (1,000,000 stored)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also the core and MCP phases on a local 3-master Redis Cluster",
    )
    parser.add_argument("--no-uvloop", dest="uvloop", action="store_false", help="plain asyncio loop")
    parser.add_argument("--json", help="also write the final figures to this file")
    parser.add_argument(
        "--only", help=f"run only these parts, comma-separated: {', '.join(PARTS)} (the rest skipped)"
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="run this code and git REF in alternating runs, then print the ratio of each figure",
    )
    parser.add_argument(
        "--compare-rounds", type=int, default=2, help="runs of each with --compare (default 2)"
    )
    args = parser.parse_args()
    if args.only:
        wanted = {part.strip() for part in args.only.split(",") if part.strip()}
        unknown = wanted - set(PARTS)
        if unknown:
            parser.error(
                f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}"
            )
        for part in PARTS:
            if part not in wanted:
                setattr(args, f"skip_{part}", True)
    if args.compare:
        return compare(args, sys.argv[1:])
    if args.uvloop:
        try:
            import uvloop
        except ImportError:
            args.uvloop = False
        else:
            return int(uvloop.run(bench(args)))
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
