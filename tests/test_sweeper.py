"""The background sweep a relay runs with ``sweep_every``: expired mail leaves an inbox nobody fetches."""

from __future__ import annotations

import redis

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.redis.keys import Keys
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.base import Limits
from broker.testing.delivery_conformance import FakeClock
from broker.testing.polling import eventually
from tests.support import address_for, redis_relays, unique_prefix


async def test_the_background_sweep_moves_expired_envelopes_to_the_dead_letters() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    relay = Relay(
        AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state), clock=clock, sweep_every=0.01
    )
    async with relay:
        for agent in ("alice", "bob"):
            await relay.register(agent, address_for(Tier.HOST, agent), f"s-{agent}")
        body = AgentMessage(kind=Kind.KIND_NOTE, text="stale soon")
        sent = await relay.send("alice", "bob", body, ttl_ms=1000)
        kept = await relay.send("alice", "bob", body)
        clock.advance(1001)
        await eventually(lambda: bool(state.dead.get("bob")), 5.0, "the sweep moved the expired envelope")
        assert [d.envelope_id for d in state.dead["bob"]] == [sent.id]
        assert state.dead["bob"][0].reason == "expired"
        assert [s.state for s in await relay.status("alice", [sent.id, kept.id])] == ["expired", "queued"]
    assert relay._sweeper is None  # stopped with the relay


async def test_an_agent_whose_sweep_is_refused_does_not_stop_the_others(redis_url: str) -> None:
    """A damaged key (here a dead-letter stream an operator overwrote with a string) makes Redis refuse
    that agent's sweep (WRONGTYPE); the agents after it are swept all the same."""
    clock = FakeClock()
    prefix = unique_prefix()
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with redis_relays(AgentMessageContract(), redis_url, 1, Limits(clock=clock), prefix=prefix) as (
            relay,
        ):
            for agent in ("alice", "bob", "carol"):
                await relay.register(agent, address_for(Tier.HOST, agent), f"s-{agent}")
            body = AgentMessage(kind=Kind.KIND_NOTE, text="stale soon")
            for to in ("bob", "carol"):
                await relay.send("alice", to, body, ttl_ms=1000)
            store.set(Keys(prefix).dead_letters("bob"), "not a stream")
            clock.advance(1001)
            assert await relay.sweep() == 1
            assert store.xlen(Keys(prefix).dead_letters("carol")) == 1
    finally:
        store.close()
