"""What the sender's status costs in Redis memory, per envelope (docs/delivery.md):

    python bench/status_bytes.py [N]     # N envelopes, default 20,000; a few seconds

One sender sends N envelopes to 8 recipients through ``Relay.send`` (status on, the default
retention); the recipients acknowledge every envelope but 1 in 50, which they leave to the poison
limit (``max_deliveries`` 1, so the second fetch dead-letters it). Then ``MEMORY USAGE`` (all samples)
of every status key, the day index on the sender's slot and the outcome records on the recipients',
summed and divided by N. Idempotency records are measured the same way, for N sends with a key.

The last line starts with ``status-bytes``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.relay import Relay

RECIPIENTS = [f"worker-{i}" for i in range(8)]


async def key_bytes(client: Redis, pattern: str) -> int:
    total = 0
    async for key in client.scan_iter(match=pattern, count=1000):
        total += int(await client.memory_usage(key, samples=0) or 0)
    return total


async def measure(url: str, n: int) -> tuple[float, float]:
    connection = RedisConnection(RedisSettings(url=url, prefix="sb", max_deliveries=1))
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    async with relay:
        for agent in ["boss", *RECIPIENTS]:
            await relay.register(agent, address, f"{agent}-1")
        body = AgentMessage(kind=Kind.KIND_REQUEST, text="please run the nightly build")
        batch = 500
        for start in range(0, n, batch):
            await asyncio.gather(
                *(
                    relay.send("boss", RECIPIENTS[i % len(RECIPIENTS)], body)
                    for i in range(start, start + batch)
                )
            )
            for agent in RECIPIENTS:
                got = await relay.fetch(agent, 256)
                await relay.ack(agent, [e.id for e in got if not e.id.endswith(("0", "1"))])
                await relay.fetch(agent, 256)  # the ones left are dead-lettered at this hand-out
        idempotent = [
            relay.send("boss", "worker-0", body, idempotency_key=f"job-{i}") for i in range(n // 10)
        ]
        for start in range(0, len(idempotent), batch):
            await asyncio.gather(*idempotent[start : start + batch])
    client = Redis.from_url(url)
    try:
        status = await key_bytes(client, "sb:sent:*") + await key_bytes(client, "sb:outcome:*")
        idem = await key_bytes(client, "sb:claim:*") + await key_bytes(client, "sb:idem:*")
    finally:
        await client.aclose()
    return status / n, idem / (n // 10)


async def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    server = EmbeddedRedis()
    server.start()
    try:
        status, idem = await measure(server.url, n)
    finally:
        server.stop()
    print(f"status-bytes n={n} status={status:.1f} B/envelope idempotency={idem:.1f} B/keyed send")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
