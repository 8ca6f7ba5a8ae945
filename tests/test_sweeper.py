"""The background sweep a relay runs with ``sweep_every``: expired mail leaves an inbox nobody fetches."""

from __future__ import annotations

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.delivery_conformance import FakeClock
from broker.testing.polling import eventually
from tests.support import address_for


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
