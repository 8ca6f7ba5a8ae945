"""What three design choices cost, measured on this machine (docs/performance.md):

    python bench/costs.py      # about a minute

- wake-ups: Redis CPU per ``send_append`` call with its ``PUBLISH`` against the same script without
  it, on one Redis and on a local 3-master cluster (two subscribed workers, as in production);
- ``--wait-replicas 1``: relay's send -> fetch -> ack at concurrency 16 on a master with one replica,
  with ``WAIT`` and without;
- the agent directory: ``relay inspect``'s listing (pages of the index, ``adapters/redis/directory.py``)
  and one gauge refresh, with 1,000 registered agents, on one Redis and on the cluster;
- published result schemas: client CPU of the official ``mcp`` client's check of one result (a compiled
  Draft 2020-12 validator, ``best_match`` of its errors) against the tool's output schema, and against
  ``{"type": "object"}`` (what checking costs a client when nothing is typed), for the hot tools.

The last line starts with ``costs-bench``.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.gauges import InboxGauges
from adapters.redis.inbox import DAY_MS
from adapters.redis.inspect import Inspector
from adapters.redis.protocol import Call, send_call, with_tier
from adapters.redis.protocol_operator import register_call
from adapters.redis.scripts import build_library
from broker import schemas
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import now_ms
from broker.ports import SendOptions
from broker.relay import Relay
from tests.cluster_support import LocalCluster

LUA = Path(__file__).resolve().parents[1] / "adapters" / "redis" / "lua"
CALLS = 20_000
NOW = "2026-01-01T00:00:00.000Z"
BODY = ("kind", "note", "text", "x" * 300)
ADDRESS = ClaudeCodeAddress.parse("127.0.0.1:1")
AGENTS = 1000


async def redis_cpu(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        client = Redis.from_url(url, decode_responses=True)
        info = await client.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        await client.aclose()
    return total


def _append(connection: RedisConnection, to: str, nonce: str) -> Call:
    """``send_append``'s call from sender ``s`` (host tier) to ``to``, as relay builds it."""
    now = now_ms()
    send = send_call(
        connection.keys,
        connection.settings,
        "s",
        to,
        dict(zip(BODY[::2], BODY[1::2], strict=True)),
        sent_at_ms=now,
        session="s",
        options=SendOptions(),
        nonce=nonce,
        day=now // DAY_MS,
        index_until=0,
    )
    return with_tier(send.append, "host", "claudecode")


async def publish_cost(url: str, urls: list[str], calls: int = CALLS) -> tuple[float, float]:
    """Redis CPU µs per send_append call: (with PUBLISH, without), two subscribers listening."""
    connection = RedisConnection(RedisSettings(url=url, prefix=f"pc{secrets.token_hex(3)}"))
    await connection.open()
    keys = connection.keys
    full = connection.scripts.send_append
    body = (LUA / "send_append.lua").read_text(encoding="utf-8")
    quiet_body = body.replace("redis.call('PUBLISH', wake_channel, recipient)", "")
    assert quiet_body != body
    library, variant = build_library({"send_append": quiet_body})
    quiet = variant["send_append"]
    for node in urls:  # the connection loads only relay's own library
        loader = Redis.from_url(node)
        await loader.function_load(library.source, replace=True)
        await loader.aclose()
    listeners = [Redis.from_url(urls[i % len(urls)], decode_responses=True).pubsub() for i in range(2)]
    for listener in listeners:
        await listener.subscribe(keys.wake_channel())
    drain = [asyncio.create_task(_drain(listener)) for listener in listeners]
    try:
        figures = []
        for script in (full, quiet):
            agents = [f"a{i}" for i in range(64)]
            for agent in agents:
                call = register_call(keys, agent, ADDRESS, "s", now=now_ms())
                await connection.script(connection.scripts.register, call.keys, call.args, idempotent=True)
            before = await redis_cpu(urls)
            for start in range(0, calls, 256):
                await asyncio.gather(
                    *(
                        connection.script(script, call.keys, call.args, idempotent=False)
                        for i in range(start, min(start + 256, calls))
                        for call in [_append(connection, agents[i % len(agents)], f"N{i:09d}")]
                    )
                )
            figures.append((await redis_cpu(urls) - before) / calls * 1e6)
        return figures[0], figures[1]
    finally:
        for task in drain:
            task.cancel()
        for listener in listeners:
            await listener.aclose()
        await connection.close()


async def _drain(listener: Any) -> None:
    while True:
        await listener.get_message(timeout=1.0)


async def wait_cost(seconds: float) -> tuple[float, float]:
    """relay's send -> fetch -> ack msgs/s at concurrency 16: (no WAIT, WAIT 1), one replica."""
    master = EmbeddedRedis()
    master.start()
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    replica.start()
    try:
        check = Redis(port=replica.port, decode_responses=True)
        for _ in range(500):
            if (await check.info("replication")).get("master_link_status") == "up":
                break
            await asyncio.sleep(0.02)
        await check.aclose()
        rates: dict[int, list[float]] = {0: [], 1: []}
        for replicas in (0, 1, 0, 1, 0, 1):  # interleaved rounds, median of each
            rates[replicas].append(await cycle_rate(master.url, seconds, wait_replicas=replicas))
        return sorted(rates[0])[1], sorted(rates[1])[1]
    finally:
        replica.stop()
        master.stop()


async def cycle_rate(url: str, seconds: float, **settings: Any) -> float:
    connection = RedisConnection(RedisSettings(url=url, prefix=f"wc{secrets.token_hex(3)}", **settings))
    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    body = AgentMessage(kind=Kind.KIND_NOTE, text="x" * 300)
    async with Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection)) as relay:
        for k in range(16):
            await relay.register(f"s{k}", address, "s")
            await relay.register(f"r{k}", address, "s")

        async def loop(k: int, deadline: float) -> int:
            n = 0
            while time.perf_counter() < deadline:
                await relay.send(f"s{k}", f"r{k}", body)
                got = await relay.fetch(f"r{k}", 1)
                await relay.ack(f"r{k}", [e.id for e in got])
                n += 1
            return n

        start = time.perf_counter()
        done = await asyncio.gather(*(loop(k, start + seconds) for k in range(16)))
        return sum(done) / (time.perf_counter() - start)


async def directory_cost(url: str) -> tuple[float, float]:
    """Seconds for (a full listing of AGENTS registered agents, one gauge refresh)."""
    connection = RedisConnection(RedisSettings(url=url, prefix=f"dc{secrets.token_hex(3)}"))
    await connection.open()
    try:
        registry = RedisRegistry(connection)
        address = ClaudeCodeAddress.parse("127.0.0.1:14111")
        for start in range(0, AGENTS, 100):
            await asyncio.gather(
                *(registry.register(f"agent-{i:04d}", address, "s") for i in range(start, start + 100))
            )
        inspector = Inspector(connection)
        await inspector.directory.agents()  # a fresh store: the first listing builds the index (a scan)
        started = time.perf_counter()
        listed = await inspector.directory.agents()
        listing = time.perf_counter() - started
        assert len(listed) == AGENTS, len(listed)
        gauges = InboxGauges(connection)
        started = time.perf_counter()
        await gauges.refresh()
        return listing, time.perf_counter() - started
    finally:
        await connection.close()


def _results() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each hot tool's output schema and a real-shaped result: 16 envelopes fetched, acknowledged and
    asked about, one sent."""
    ids = [f"env_01M8W1J0VG{n:06d}XYVFX2NMSN"[:30] for n in range(16)]
    envelope = {
        "from": "alice",
        "tier": "host",
        "message": {"kind": 2, "text": "please review PR 12", "reference": "https://x/12"},
        "sent_at": NOW,
        "deliveries": 1,
    }
    return {
        "SendAgentMessage": (schemas.SENT, {"id": ids[0], "to": "bob", "tier": "host", "sent_at": NOW}),
        "FetchAgentInbox": (schemas.INBOX, {"envelopes": [{"id": i, **envelope} for i in ids]}),
        "AcknowledgeAgentInbox": (schemas.ACKNOWLEDGEMENT, {"acknowledged": ids, "unknown": []}),
        "GetMessageStatus": (
            schemas.STATUSES,
            {
                "statuses": [
                    {"id": i, "state": "delivered", "to": "bob", "deliveries": 1, "sent_at": NOW} for i in ids
                ]
            },
        ),
    }


def validation_cost(rounds: int = 2000) -> dict[str, tuple[float, float]]:
    """Per hot tool: µs of client CPU to check one result against (its output schema, a bare object)."""
    from jsonschema import exceptions
    from jsonschema.validators import validator_for
    from referencing import Registry

    costs: dict[str, tuple[float, float]] = {}
    for tool, (schema, result) in _results().items():
        timed = []
        for checked in (schema, {"type": "object"}):
            validator = validator_for(checked)(checked, registry=Registry())
            assert exceptions.best_match(validator.iter_errors(result)) is None, tool
            start = time.process_time()
            for _ in range(rounds):
                exceptions.best_match(validator.iter_errors(result))
            timed.append((time.process_time() - start) / rounds * 1e6)
        costs[tool] = (timed[0], timed[1])
    return costs


async def main() -> int:
    figures: dict[str, float] = {}
    for tool, (typed, bare) in validation_cost().items():
        print(f"{tool} result checked by the mcp client: {typed:.0f} µs against its schema, {bare:.0f} bare")
        figures[f"validate_{tool}_us"] = round(typed)
    server = EmbeddedRedis()
    server.start()
    try:
        with_pub, without = await publish_cost(server.url, [server.url])
        print(
            f"one Redis: send_append {with_pub:.1f} µs Redis CPU with PUBLISH, {without:.1f} without",
            flush=True,
        )
        figures |= {"single_publish_us": round(with_pub - without, 1), "single_append_us": round(without, 1)}
        listing, refresh = await directory_cost(server.url)
        print(
            f"one Redis: {AGENTS} agents listed in {listing * 1000:.0f} ms, "
            f"gauges refreshed in {refresh * 1000:.0f} ms"
        )
        figures |= {"single_list_ms": round(listing * 1000), "single_refresh_ms": round(refresh * 1000)}
    finally:
        server.stop()
    cluster = LocalCluster(masters=3, replicas=0)
    cluster.start()
    try:
        with_pub, without = await publish_cost(cluster.url, cluster.urls)
        print(
            f"cluster: send_append {with_pub:.1f} µs Redis CPU (all masters) with PUBLISH, "
            f"{without:.1f} without"
        )
        figures |= {
            "cluster_publish_us": round(with_pub - without, 1),
            "cluster_append_us": round(without, 1),
        }
        listing, refresh = await directory_cost(cluster.url)
        print(
            f"cluster: {AGENTS} agents listed in {listing * 1000:.0f} ms, "
            f"gauges refreshed in {refresh * 1000:.0f} ms"
        )
        figures |= {"cluster_list_ms": round(listing * 1000), "cluster_refresh_ms": round(refresh * 1000)}
    finally:
        cluster.stop()
    plain, durable = await wait_cost(2.0)
    print(
        f"send -> fetch -> ack, c16: {plain:.0f} msg/s without WAIT, {durable:.0f} with WAIT 1 (one replica)"
    )
    figures |= {
        "wait0_msgs_per_s": round(plain),
        "wait1_msgs_per_s": round(durable),
        "wait1_ratio": round(durable / plain, 2),
    }
    print("costs-bench " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    import uvloop

    sys.exit(uvloop.run(main()))
