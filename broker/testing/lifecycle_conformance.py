"""The contract of retiring an agent and purging an inbox (``IRegistry.retire``, ``IInboxStore.purge``),
for every backend.

Subclass it in a test module (the class name must start with ``Test``) and implement the hooks::

    class TestMyLifecycle(LifecycleConformance[MyBody]):
        def make_lifecycle(self): ...       # the stores of one fresh store, see Lifecycle
        def body(self, n): ...              # distinct valid bodies
        def address(self, tier, agent): ... # an address of that tier
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

import pytest

from broker.addresses import Address
from broker.delivery import IDeliveryQueue
from broker.envelope import Envelope, Tier, now_ms
from broker.errors import AgentRetired, SessionSuperseded, UnknownRecipient, UnregisteredAgent
from broker.ports import IInboxStore, IOperatorView, IRegistry
from broker.presence import GONE, LIVE, PRESENCE_WINDOW_MS, presence
from broker.relay import Relay
from broker.testing.base import WAIT_BOUND
from broker.testing.polling import eventually

Body = TypeVar("Body")


@dataclass(frozen=True, slots=True)
class Lifecycle(Generic[Body]):
    """A started relay and, on the same fresh store, its registry and inbox store, an opened operator
    view and an opened delivery queue (history kept, the default retention)."""

    relay: Relay[Body]
    registry: IRegistry
    inbox: IInboxStore
    view: IOperatorView
    queue: IDeliveryQueue


class LifecycleConformance(ABC, Generic[Body]):
    @abstractmethod
    def make_lifecycle(self) -> AbstractAsyncContextManager[Lifecycle[Body]]: ...

    @abstractmethod
    def body(self, n: int) -> Body: ...

    @abstractmethod
    def address(self, tier: Tier, agent: str) -> Address: ...

    async def _agents(self, relay: Relay[Body], *names: str) -> None:
        for name in names:
            await relay.register(name, self.address(Tier.HOST, name), f"s-{name}")

    async def _seen(self, relay: Relay[Body], agent: str) -> int:
        registration = await relay.registration(agent)
        assert registration is not None and registration.last_seen_ms is not None
        return registration.last_seen_ms

    async def test_a_mail_pending_wait_is_a_sign_of_its_session(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "bob")
            before = await self._seen(relay, "bob")
            await eventually(lambda: now_ms() > before + 2, WAIT_BOUND, "the clock moved on")
            await relay.wait_for_mail("bob", "s-bob", 0)
            after = await self._seen(relay, "bob")
            assert after > before
            page = await it.view.agents()
            (bob,) = page.agents
            assert bob.last_seen_ms == after and presence(bob.last_seen_ms, page.now_ms) == LIVE
            assert presence(after, after + PRESENCE_WINDOW_MS) == LIVE
            assert presence(after, after + PRESENCE_WINDOW_MS + 1) == GONE
            assert presence(None, after) == GONE

    async def test_a_session_that_left_is_gone_until_its_next_sign(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "alice", "bob")
            assert not await relay.leave("bob", "s-other")  # only the registered session may say so
            assert not await relay.leave("nobody", "s-bob")
            assert (await relay.registration("bob")).ended_at_ms is None  # type: ignore[union-attr]
            assert await relay.leave("bob", "s-bob")
            page = await it.view.agents()
            bob = {a.agent: a for a in page.agents}["bob"]
            assert bob.ended_at_ms is not None and bob.last_seen_ms is not None
            assert presence(bob.last_seen_ms, page.now_ms, bob.ended_at_ms) == GONE
            (listed,) = [r for r in await relay.registrations() if r.agent == "bob"]
            assert presence(listed.last_seen_ms, page.now_ms, listed.ended_at_ms) == GONE
            sent = (await relay.send("alice", "bob", self.body(1))).id  # mail still lands
            await eventually(lambda: now_ms() > bob.ended_at_ms + 2, WAIT_BOUND, "the clock moved on")  # type: ignore[operator]
            assert [e.id for e in await relay.fetch("bob", 4, session="s-bob")] == [sent]
            again = await relay.registration("bob")
            assert again is not None and presence(again.last_seen_ms, now_ms(), again.ended_at_ms) == LIVE

    async def test_retire_ends_the_registration_and_refuses_its_sessions(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "alice", "bob")
            await relay.register("bob", self.address(Tier.HOST, "bob"), "s-bob-2")  # s-bob superseded
            sent = [(await relay.send("alice", "bob", self.body(n))).id for n in range(2)]
            await relay.fetch("bob", 1)
            done = await it.registry.retire("bob")
            assert (done.agent, done.sessions, done.now, done.purged) == (
                "bob",
                ("s-bob-2", "s-bob"),
                True,
                0,
            )
            with pytest.raises(UnknownRecipient):
                await relay.send("alice", "bob", self.body(3))
            for session in ("s-bob-2", "s-bob", None):
                with pytest.raises(AgentRetired):
                    await relay.fetch("bob", 4, session=session)
            with pytest.raises(AgentRetired):
                await relay.ack("bob", sent, session="s-bob-2")
            with pytest.raises(AgentRetired):
                await relay.send("bob", "alice", self.body(4), session="s-bob-2")
            with pytest.raises(AgentRetired):
                await relay.status("bob", sent, session="s-bob")
            with pytest.raises(AgentRetired):
                await relay.register("bob", self.address(Tier.HOST, "bob"), "s-bob")
            with pytest.raises(UnregisteredAgent):  # a session bob never had: not registered
                await relay.fetch("bob", 4, session="s-other")
            assert await relay.registration("bob") is None
            assert [r.agent for r in await relay.registrations()] == ["alice"]
            assert [a.agent for a in (await it.view.agents()).agents] == ["alice"]
            # what was queued stays readable to operators, and its sender still learns where it is
            assert [e.envelope_id for e in await it.view.unacknowledged("bob")] == sent
            assert [s.state for s in await relay.status("alice", sent)] == ["delivered", "queued"]
            again = await it.registry.retire("bob")
            assert (again.now, again.sessions) == (False, ("s-bob-2", "s-bob"))
            with pytest.raises(UnregisteredAgent):
                await it.registry.retire("nobody")

    async def test_a_new_session_may_register_a_retired_id_again(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "alice", "bob")
            kept = (await relay.send("alice", "bob", self.body(1))).id
            await it.registry.retire("bob")
            fresh = await relay.register("bob", self.address(Tier.HOST, "bob"), "s-new")
            assert fresh.created and fresh.registration.session == "s-new"
            with pytest.raises(SessionSuperseded):
                await relay.fetch("bob", 4, session="s-bob")
            assert [e.id for e in await relay.fetch("bob", 4, session="s-new")] == [kept]
            assert (await relay.send("alice", "bob", self.body(2))).to == "bob"

    async def test_a_parked_fetch_of_a_retired_agent_is_refused(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "alice", "bob")
            parked = asyncio.ensure_future(relay.fetch("bob", 4, wait=WAIT_BOUND, session="s-bob"))
            await eventually(lambda: relay.parked_fetches("bob") >= 1, WAIT_BOUND, "bob's fetch parked")
            await it.registry.retire("bob")
            with pytest.raises(AgentRetired):
                await asyncio.wait_for(parked, WAIT_BOUND)

    async def test_retire_with_purge_deletes_inbox_dead_letters_and_history(self) -> None:
        async with self.make_lifecycle() as it:
            relay, view = it.relay, it.view
            await self._agents(relay, "alice", "bob")
            acked, doomed, queued = [(await relay.send("alice", "bob", self.body(n))).id for n in range(3)]
            (first,) = await relay.fetch("bob", 1)
            await relay.ack("bob", [first.id])
            (claimed,) = await it.queue.claim("bob", "bob@loop", 1, visibility=30.0)
            assert claimed.envelope_id == doomed
            assert await it.queue.dead_letter("bob", doomed, "RuntimeError: boom", consumer="bob@loop")
            assert len((await view.history("bob")).entries) == 2
            done = await it.registry.retire("bob", purge=True)
            assert (done.now, done.purged) == (True, 1)
            assert await view.unacknowledged("bob") == []
            assert (await view.history("bob")).entries == []
            assert await it.queue.dead_letters("bob") == []
            states = [s.state for s in await relay.status("alice", [acked, doomed, queued])]
            assert states == ["acknowledged", "dead_lettered", "purged"]

    async def test_purge_drops_what_is_queued_and_records_it_purged(self) -> None:
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, "alice", "carol", "bob")
            senders = ["alice", "carol", "alice"]
            sent = [(await relay.send(who, "bob", self.body(n))).id for n, who in enumerate(senders)]
            await relay.fetch("bob", 1)
            assert await it.inbox.purge("bob") == 3
            assert await it.view.unacknowledged("bob") == []
            assert await relay.fetch("bob", 4, session="s-bob") == []
            for sender, one, deliveries in zip(senders, sent, (1, 0, 0), strict=True):
                (status,) = await relay.status(sender, [one])
                assert (status.state, status.to, status.deliveries) == ("purged", "bob", deliveries)
            assert (await it.view.history("bob")).entries == []  # dropped, not archived
            later = (await relay.send("alice", "bob", self.body(9))).id
            assert [e.id for e in await relay.fetch("bob", 4)] == [later]
            assert await it.inbox.purge("bob") == 1
            assert await it.inbox.purge("bob") == 0
            assert await it.inbox.purge("nobody") == 0

    @pytest.mark.parametrize("purge", [False, True])
    async def test_sends_during_a_retire_are_refused_or_accounted_for(self, purge: bool) -> None:
        senders, each = [f"s{n}" for n in range(6)], 30
        async with self.make_lifecycle() as it:
            relay = it.relay
            await self._agents(relay, *senders, "bob")
            landed: list[Envelope[Body]] = []
            refused = [0]
            some = asyncio.Event()

            async def send_all(sender: str) -> None:
                for n in range(each):
                    try:
                        landed.append(await relay.send(sender, "bob", self.body(n), session=f"s-{sender}"))
                    except UnknownRecipient:
                        refused[0] += 1
                    if len(landed) >= 20:
                        some.set()
                    await asyncio.sleep(0)  # lets the retire in between the sends of a memory store

            sending = asyncio.gather(*(send_all(s) for s in senders))
            await asyncio.wait_for(some.wait(), WAIT_BOUND * 4)
            done = await it.registry.retire("bob", purge=purge)
            await asyncio.wait_for(sending, WAIT_BOUND * 4)
            assert len(landed) + refused[0] == len(senders) * each and refused[0] > 0
            queued = [e.envelope_id for e in await it.view.unacknowledged("bob", limit=1000)]
            for sender in senders:
                mine = [e.id for e in landed if e.sender == sender]
                states = {s.state for s in await relay.status(sender, mine)} if mine else set()
                assert states <= ({"purged"} if purge else {"queued"}), (sender, states)
            if purge:
                assert queued == [] and done.purged == len(landed)
            else:
                assert sorted(queued) == sorted(e.id for e in landed)
