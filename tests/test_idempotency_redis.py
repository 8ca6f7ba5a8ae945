"""Idempotent send on Redis across its two steps: a first attempt that claimed its key and never
landed, one whose answer was lost after it landed, and concurrent repeats from two workers."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from adapters.redis.keys import Keys
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.limits import request_hash
from tests.support import address_for, redis_relays, unique_prefix

BODY = AgentMessage(kind=Kind.KIND_REQUEST, text="run the migration once")


async def _register(relay: object, *agents: str) -> None:
    for agent in agents:
        await relay.register(agent, address_for(Tier.HOST, agent), f"s-{agent}")  # type: ignore[attr-defined]


async def test_a_first_attempt_that_claimed_the_key_but_never_landed_is_sent_by_the_repeat(
    redis_url: str,
) -> None:
    prefix, keys = unique_prefix(), None
    async with redis_relays(AgentMessageContract(), redis_url, 1, prefix=prefix) as (relay,):
        keys = Keys(prefix)
        await _register(relay, "alice", "bob")
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            # step 1 of the first attempt ran (the claim), then its worker died before step 2
            fields = AgentMessageContract().to_fields(BODY)
            await client.set(
                keys.idempotency_claim("alice", "job-7"), request_hash("bob", fields, None), px=60_000
            )
            sent = await relay.send("alice", "bob", BODY, idempotency_key="job-7")
            again = await relay.send("alice", "bob", BODY, idempotency_key="job-7")
            assert again.id == sent.id and await client.xlen(keys.inbox("bob")) == 1
            assert [s.state for s in await relay.status("alice", [sent.id])] == ["queued"]
        finally:
            await client.aclose()


async def test_a_repeat_after_a_lost_answer_returns_what_landed(redis_url: str) -> None:
    prefix = unique_prefix()
    async with redis_relays(AgentMessageContract(), redis_url, 2, prefix=prefix) as (one, two):
        await _register(one, "alice", "bob")
        landed = await one.send("alice", "bob", BODY, idempotency_key="k", ttl_ms=60_000)
        # the client never saw `landed` (its request timed out) and retries on another worker
        retried = await two.send("alice", "bob", BODY, idempotency_key="k", ttl_ms=60_000)
        assert (retried.id, retried.sent_at) == (landed.id, landed.sent_at)
        assert [e.id for e in await two.fetch("bob", 16)] == [landed.id]


async def test_concurrent_repeats_on_two_workers_store_one_envelope(redis_url: str) -> None:
    prefix = unique_prefix()
    async with redis_relays(AgentMessageContract(), redis_url, 2, prefix=prefix) as (one, two):
        await _register(one, "alice", "bob")
        sends = [
            (one if i % 2 else two).send("alice", "bob", BODY, idempotency_key="burst") for i in range(20)
        ]
        results = await asyncio.gather(*sends)
        assert len({r.id for r in results}) == 1
        got = await one.fetch("bob", 16)
        assert [e.id for e in got] == [results[0].id]
        assert [s.state for s in await one.status("alice", [results[0].id])] == ["delivered"]
