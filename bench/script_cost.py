"""Redis CPU per acknowledged envelope of ``ack.lua`` in isolation (docs/performance.md):

    python bench/script_cost.py             # one envelope per acknowledgement, then 16
    python bench/script_cost.py --batch 16  # only 16 per acknowledgement

Per round, a fresh inbox on a fresh ``EmbeddedRedis`` (append-only, ``appendfsync everysec``) gets
3,008 envelopes through relay's send (idempotency key, ``ttl_ms``, relay serve's poison limit), all
read into the group's pending list with one ``XREADGROUP``, then acknowledged by ``ack.lua`` calls of
``--batch`` envelopes each, exactly as relay builds them (``ack_call``), 500 calls deep in redis-py
pipelines: Redis's ``used_cpu_sys + used_cpu_user`` over the acknowledgements, divided by the
envelopes. With history kept (the default) and without it (``history_retention_ms`` 0). The lowest of
3 rounds: the script's own work, with the network I/O of one round trip per message amortised away.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import GROUP, RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.inbox import outcome_hash
from adapters.redis.protocol_inbox import HistoryRule, ack_call
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import now_ms
from broker.limits import DEFAULT_MAX_DELIVERIES
from broker.relay import Relay

ENVELOPES = 3008
DEPTH = 500
ROUNDS = 3


async def _cpu(client: Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def ack_cost(url: str, batch: int, settings: dict[str, Any], tag: str) -> float:
    """Redis CPU µs per envelope acknowledged ``batch`` at a time (one round)."""
    connection = RedisConnection(RedisSettings(url=url, prefix=f"sc{tag}", **settings))
    monitor = Redis.from_url(url)
    address = ClaudeCodeAddress.parse("127.0.0.1:1")
    body = AgentMessage(kind=Kind.KIND_NOTE, text="x" * 300)
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    try:
        async with relay:
            await relay.register("s", address, "x")
            await relay.register("r", address, "x")
            for start in range(0, ENVELOPES, 100):
                await asyncio.gather(
                    *(
                        relay.send("s", "r", body, session="x", idempotency_key=f"k{i}", ttl_ms=3_600_000)
                        for i in range(start, min(start + 100, ENVELOPES))
                    )
                )
            inbox = connection.keys.inbox("r")
            reply = await monitor.xreadgroup(GROUP, "r", {inbox: ">"}, count=ENVELOPES)
            rows = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
            entries = [(i.decode(), f[b"nonce"].decode()) for i, f in rows]
            assert len(entries) == ENVELOPES
            outcomes, until = outcome_hash(connection, "r", now_ms())
            keep = HistoryRule.of(connection.settings)
            calls = [
                ack_call(
                    connection.keys,
                    "r",
                    "x",
                    entries[j : j + batch],
                    outcomes=outcomes,
                    until=until,
                    keep=keep,
                )
                for j in range(0, ENVELOPES, batch)
            ]
            sha = await monitor.script_load(connection.scripts.ack.source)
            before = await _cpu(monitor)
            for start in range(0, len(calls), DEPTH):
                pipe = monitor.pipeline(transaction=False)
                for call in calls[start : start + DEPTH]:
                    pipe.evalsha(sha, len(call.keys), *call.keys, *call.args)
                for answer in await pipe.execute():
                    assert all(one != 0 for one in answer), "an envelope was not acknowledged"
            return (await _cpu(monitor) - before) / ENVELOPES * 1e6
    finally:
        await monitor.aclose()


async def main(args: argparse.Namespace) -> int:
    server = EmbeddedRedis(appendfsync="everysec")
    server.start()
    figures: dict[str, float] = {}
    try:
        on = {"max_deliveries": DEFAULT_MAX_DELIVERIES}
        for batch in [args.batch] if args.batch else [1, 16]:
            for label, settings in (("history", on), ("no_history", {**on, "history_retention_ms": 0})):
                rounds = [
                    await ack_cost(server.url, batch, settings, f"{batch}{label}{r}") for r in range(ROUNDS)
                ]
                figures[f"ack_b{batch}_{label}_us"] = round(min(rounds), 2)
                print(
                    f"ack.lua, {batch} per call, {label.replace('_', ' ')}: {min(rounds):.2f} µs Redis CPU "
                    f"per envelope (rounds: {', '.join(f'{r:.2f}' for r in rounds)})",
                    flush=True,
                )
    finally:
        server.stop()
    print("script-cost " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, help="envelopes per acknowledgement (default: 1, then 16)")
    sys.exit(asyncio.run(main(parser.parse_args())))
