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

from adapters.redis import (
    GROUP,
    RedisConnection,
    RedisInboxStore,
    RedisPolicyStore,
    RedisRegistry,
    RedisSettings,
)
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.inbox import outcome_hash, retained_until
from adapters.redis.protocol import DAY_MS, send_call
from adapters.redis.protocol_inbox import HistoryRule, ack_call
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import now_ms
from broker.ids import new_nonce
from broker.limits import DEFAULT_MAX_DELIVERIES, MAX_POLICY_AGENTS, request_hash
from broker.policy import listing
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
            reply: Any = await monitor.xreadgroup(GROUP, "r", {inbox: ">"}, count=ENVELOPES)
            rows: list[Any] = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
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
            await monitor.function_load(connection.scripts.library.source, replace=True)
            function = connection.scripts.ack.function
            before = await _cpu(monitor)
            for start in range(0, len(calls), DEPTH):
                pipe = monitor.pipeline(transaction=False)
                for call in calls[start : start + DEPTH]:
                    pipe.fcall(function, len(call.keys), *call.keys, *call.args)
                for answer in await pipe.execute():
                    assert all(one != 0 for one in answer), "an envelope was not acknowledged"
            return (await _cpu(monitor) - before) / ENVELOPES * 1e6
    finally:
        await monitor.aclose()


async def send_cost(
    url: str,
    settings: dict[str, Any],
    tag: str,
    *,
    idempotency: bool = True,
    ttl: bool = True,
    policy: bool = False,
) -> float:
    """Redis CPU µs per ``send.lua`` call (one Redis: the whole send in one script), each a new
    envelope with its own idempotency key and a ``ttl_ms`` (unless turned off), round robin over 16
    recipients; with ``policy`` each recipient accepts a list of 1,000 ids that names the sender (one
    round)."""
    connection = RedisConnection(RedisSettings(url=url, prefix=f"sc{tag}", **settings))
    monitor = Redis.from_url(url)
    address = ClaudeCodeAddress.parse("127.0.0.1:1")
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    fields = {"kind": "note", "text": "x" * 300}
    try:
        async with relay:
            await relay.register("s", address, "x")
            policies = RedisPolicyStore(connection)
            for k in range(16):
                await relay.register(f"r{k}", address, "x")
                if policy:
                    await policies.set(
                        f"r{k}", listing(["s", *(f"x{i}" for i in range(MAX_POLICY_AGENTS - 1))])
                    )
            now = now_ms()
            day = now // DAY_MS
            calls = []
            for i in range(ENVELOPES):
                to = f"r{i % 16}"
                ttl_ms = 3_600_000 if ttl else None
                key = f"k{i}" if idempotency else None
                hashed = request_hash(to, fields, ttl_ms) if idempotency else None
                options = SendOptions(key, hashed, now + ttl_ms if ttl_ms else None)
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
            await monitor.function_load(connection.scripts.library.source, replace=True)
            function = connection.scripts.send.function
            before = await _cpu(monitor)
            for start in range(0, len(calls), DEPTH):
                pipe = monitor.pipeline(transaction=False)
                for one in calls[start : start + DEPTH]:
                    pipe.fcall(function, len(one.keys), *one.keys, *one.args)
                await pipe.execute()
            return (await _cpu(monitor) - before) / ENVELOPES * 1e6
    finally:
        await monitor.aclose()


ON: dict[str, Any] = {"max_deliveries": DEFAULT_MAX_DELIVERIES}
SEND_VARIANTS: dict[str, dict[str, Any]] = {
    "send": {},
    "send_no_idempotency": {"idempotency": False},
    "send_no_expiry": {"ttl": False},
    "send_no_status": {"settings": {**ON, "status_retention_ms": 0}},
    "send_policy": {"policy": True},
}
ACK_VARIANTS: dict[str, dict[str, Any]] = {
    "ack": {},
    "ack_no_history": {"history_retention_ms": 0},
    "ack_no_status": {"status_retention_ms": 0},
}
RULES = (
    # rule, (with, without) figure names: its cost is their difference
    ("idempotency key", ("send", "send_no_idempotency")),
    ("expiry (ttl_ms)", ("send", "send_no_expiry")),
    ("status, in the send", ("send", "send_no_status")),
    ("status, in the ack", ("ack_b1", "ack_b1_no_status")),
    ("history, in the ack", ("ack_b1", "ack_b1_no_history")),
    ("history, in an ack of 16 (per envelope)", ("ack_b16", "ack_b16_no_history")),
    ("contact policy, a list of 1,000 set", ("send_policy", "send")),
)


async def main(args: argparse.Namespace) -> int:
    server = EmbeddedRedis(appendfsync="everysec")
    server.start()
    runs: dict[str, list[float]] = {}
    try:
        for r in range(ROUNDS):  # every variant once per round: the rounds interleave
            if not args.batch:
                for name, kwargs in SEND_VARIANTS.items():
                    options = {k: v for k, v in kwargs.items() if k != "settings"}
                    cost = await send_cost(server.url, kwargs.get("settings", ON), f"{name}{r}", **options)
                    runs.setdefault(f"{name}_us", []).append(cost)
            for batch in [args.batch] if args.batch else [1, 16]:
                for name, extra in ACK_VARIANTS.items():
                    if batch != 1 and name == "ack_no_status":
                        continue
                    label = f"ack_b{batch}{name[3:]}"
                    cost = await ack_cost(server.url, batch, {**ON, **extra}, f"{label}{r}")
                    runs.setdefault(f"{label}_us", []).append(cost)
    finally:
        server.stop()
    figures = {name: round(min(values), 2) for name, values in runs.items()}
    for name, values in runs.items():
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name[:-3]:<24} {min(values):6.2f} µs Redis CPU (rounds: {rounds})", flush=True)
    for rule, (on, off) in RULES:
        if f"{on}_us" in figures and f"{off}_us" in figures:
            cost = figures[f"{on}_us"] - figures[f"{off}_us"]
            print(f"  {rule:<42} {cost:5.2f} µs", flush=True)
    print("script-cost " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, help="envelopes per acknowledgement (default: 1, then 16)")
    sys.exit(asyncio.run(main(parser.parse_args())))
