"""What history costs (docs/history.md):

    python bench/history.py [N]     # N acknowledged envelopes, default 20,000; a few seconds

One sender sends N envelopes (a 300-byte text, then a 28-byte one) to one recipient through
``Relay.send``; the recipient fetches and acknowledges every one, so each is archived in its history
by the acknowledge script. ``MEMORY USAGE key SAMPLES 0`` (every stream node counted) of the history
stream, divided by N, is the history's bytes per archived envelope. Then a thread of 6 among N
archived envelopes across 20 agents' histories is read through ``RedisOperatorView.thread`` (p50 and
p99 of 50 reads): the index walk (``adapters/redis/threads.py``), whose cost follows the thread.
Last, envelopes per second through send, fetch and acknowledge with history on and off (median of
three alternated rounds of up to 20,000 each): what archiving costs the core.

The last line starts with ``history-bytes``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.operator_view import RedisOperatorView
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.relay import Relay

ADDRESS = ClaudeCodeAddress.parse("127.0.0.1:14111")
BATCH = 250


async def archived_bytes(url: str, prefix: str, n: int, text: str) -> tuple[float, float]:
    """(history stream, history positions hash) bytes per archived envelope."""
    connection = RedisConnection(RedisSettings(url=url, prefix=prefix))
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    async with relay:
        for agent in ("boss", "worker"):
            await relay.register(agent, ADDRESS, f"{agent}-1")
        body = AgentMessage(kind=Kind.KIND_REQUEST, text=text)
        for start in range(0, n, BATCH):
            await asyncio.gather(*(relay.send("boss", "worker", body) for _ in range(min(BATCH, n - start))))
            got = await relay.fetch("worker", BATCH)
            await relay.ack("worker", [e.id for e in got])
        keys = connection.keys
    client = Redis.from_url(url)
    try:
        kept = int(await client.memory_usage(keys.history("worker"), samples=0) or 0)
        at = int(await client.memory_usage(keys.history_positions("worker"), samples=0) or 0)
        return kept / n, at / n
    finally:
        await client.aclose()


async def thread_read(url: str, n: int) -> tuple[float, float]:
    """(p50, p99) ms of a thread of 6 read among ``n`` archived envelopes of 20 agents."""
    settings = RedisSettings(url=url, prefix="ht")
    connection = RedisConnection(settings)
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    agents = [f"agent-{i}" for i in range(20)]
    async with relay:
        for agent in agents:
            await relay.register(agent, ADDRESS, f"{agent}-1")
        body = AgentMessage(kind=Kind.KIND_NOTE, text="filler of the store")
        for start in range(0, n, BATCH):
            await asyncio.gather(
                *(relay.send(agents[0], agents[1 + i % 19], body) for i in range(min(BATCH, n - start)))
            )
            for agent in agents[1:]:
                got = await relay.fetch(agent, BATCH)
                await relay.ack(agent, [e.id for e in got])
        root = (await relay.send(agents[0], agents[1], AgentMessage(kind=Kind.KIND_REQUEST, text="q"))).id
        last = root
        for hop in range(5):
            to = agents[0] if hop % 2 == 0 else agents[1]
            frm = agents[1] if hop % 2 == 0 else agents[0]
            reply = AgentMessage(kind=Kind.KIND_REPLY, text=f"a{hop}", in_reply_to=last)
            last = (await relay.send(frm, to, reply)).id
    view = RedisOperatorView(RedisConnection(settings))
    await view.open()
    try:
        times = []
        for _ in range(50):
            began = time.perf_counter()
            found = await view.thread(root)
            times.append((time.perf_counter() - began) * 1000)
            assert len(found) == 6, len(found)
    finally:
        await view.close()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


async def cycle_rate(url: str, prefix: str, n: int, retention_ms: int) -> float:
    """Envelopes per second through send, fetch and acknowledge (64 at a time) with the given history
    retention: the core's cost of archiving, history on next to off."""
    settings = RedisSettings(url=url, prefix=prefix, history_retention_ms=retention_ms)
    connection = RedisConnection(settings)
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    body = AgentMessage(kind=Kind.KIND_NOTE, text="x" * 300)
    async with relay:
        for agent in ("boss", "worker"):
            await relay.register(agent, ADDRESS, f"{agent}-1")
        began = time.perf_counter()
        for start in range(0, n, 64):
            await asyncio.gather(*(relay.send("boss", "worker", body) for _ in range(min(64, n - start))))
            got = await relay.fetch("worker", 64)
            await relay.ack("worker", [e.id for e in got])
        return n / (time.perf_counter() - began)


async def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    server = EmbeddedRedis()
    server.start()
    try:
        long, at = await archived_bytes(server.url, "hb", n, "x" * 300)
        short, _ = await archived_bytes(server.url, "hs", n, "please run the nightly build")
        p50, p99 = await thread_read(server.url, n)
        rates = {"on": [], "off": []}  # alternated, three rounds each: the machine is shared
        for round_ in range(3):
            for label, keep in (("on", 30 * 24 * 3600 * 1000), ("off", 0)):
                rates[label].append(await cycle_rate(server.url, f"hc{label}{round_}", min(n, 20_000), keep))
        on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    finally:
        server.stop()
    print(
        f"history-bytes n={n} text300={long:.1f} B/envelope text28={short:.1f} B/envelope "
        f"positions={at:.1f} B/envelope thread6_of_{n}_p50={p50:.2f}ms p99={p99:.2f}ms (index walk) "
        f"cycle_rate_history_on={on:.0f}/s off={off:.0f}/s ratio={on / off:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
