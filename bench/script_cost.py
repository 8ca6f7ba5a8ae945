"""Redis CPU per call of ``send.lua`` and per envelope of ``ack.lua``, in isolation
(docs/performance.md):

    python bench/script_cost.py             # send.lua; ack.lua one envelope per call, then 16
    python bench/script_cost.py --batch 16  # only ack.lua, 16 per acknowledgement

On a fresh ``EmbeddedRedis`` (append-only, ``appendfsync everysec``), 500 calls deep in redis-py
pipelines, Redis's ``used_cpu_sys + used_cpu_user`` over the calls: the scripts' own work, with the
network I/O of a round trip per message amortised away. The lowest of 3 rounds.

- ``send.lua``: 3,008 sends as relay builds them on one Redis (``send_call``, combined), each with an
  idempotency key and a ``ttl_ms``, round robin over 16 recipients.
- ``ack.lua``: a fresh inbox gets 3,008 envelopes through relay's send (idempotency key, ``ttl_ms``,
  relay serve's poison limit), all read into the group's pending list with one ``XREADGROUP``, then
  acknowledged by calls of ``--batch`` envelopes each, as relay builds them (``ack_call``); with
  history kept (the default) and without it (``history_retention_ms`` 0).
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
from adapters.redis.inbox import DAY_MS, outcome_hash, retained_until
from adapters.redis.protocol import send_call
from adapters.redis.protocol_inbox import HistoryRule, ack_call
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import now_ms
from broker.ids import new_nonce
from broker.limits import DEFAULT_MAX_DELIVERIES, request_hash
from broker.ports import SendOptions
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


async def send_cost(url: str, settings: dict[str, Any], tag: str) -> float:
    """Redis CPU µs per ``send.lua`` call (one Redis: the whole send in one script), each a new
    envelope with its own idempotency key and a ``ttl_ms``, round robin over 16 recipients (one round)."""
    connection = RedisConnection(RedisSettings(url=url, prefix=f"sc{tag}", **settings))
    monitor = Redis.from_url(url)
    address = ClaudeCodeAddress.parse("127.0.0.1:1")
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    fields = {"kind": "note", "text": "x" * 300}
    try:
        async with relay:
            await relay.register("s", address, "x")
            for k in range(16):
                await relay.register(f"r{k}", address, "x")
            now = now_ms()
            day = now // DAY_MS
            calls = []
            for i in range(ENVELOPES):
                to = f"r{i % 16}"
                options = SendOptions(f"k{i}", request_hash(to, fields, 3_600_000), now + 3_600_000)
                call = send_call(
                    connection.keys,
                    connection.settings,
                    "s",
                    to,
                    fields,
                    sent_at_ms=now,
                    session="x",
                    options=options,
                    nonce=new_nonce(),
                    day=day,
                    index_until=retained_until(day, connection.settings.status_retention_ms),
                )
                calls.append(call.combined())
            sha = await monitor.script_load(connection.scripts.send.source)
            before = await _cpu(monitor)
            for start in range(0, len(calls), DEPTH):
                pipe = monitor.pipeline(transaction=False)
                for one in calls[start : start + DEPTH]:
                    pipe.evalsha(sha, len(one.keys), *one.keys, *one.args)
                await pipe.execute()
            return (await _cpu(monitor) - before) / ENVELOPES * 1e6
    finally:
        await monitor.aclose()


async def main(args: argparse.Namespace) -> int:
    server = EmbeddedRedis(appendfsync="everysec")
    server.start()
    figures: dict[str, float] = {}
    try:
        on = {"max_deliveries": DEFAULT_MAX_DELIVERIES}
        if not args.batch:
            rounds = [await send_cost(server.url, on, f"send{r}") for r in range(ROUNDS)]
            figures["send_us"] = round(min(rounds), 2)
            print(
                f"send.lua: {min(rounds):.2f} µs Redis CPU per send "
                f"(rounds: {', '.join(f'{r:.2f}' for r in rounds)})",
                flush=True,
            )
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
