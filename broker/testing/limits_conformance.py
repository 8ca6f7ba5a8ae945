"""The relay conformance tests of limits: inbox cap, send rate and parked fetches (caps, session
re-check, shutdown). Part of ``RelayConformance`` (``broker.testing.conformance``)."""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import pytest

from broker.envelope import Tier
from broker.errors import (
    InboxFull,
    RateLimited,
    SessionSuperseded,
    TooManyWaits,
    UnknownRecipient,
)
from broker.testing.base import WAIT_BOUND as _WAIT_BOUND
from broker.testing.base import ConformanceBase, Limits

Body = TypeVar("Body")


class LimitsConformance(ConformanceBase[Body]):
    """The limit tests; a backend runs them through ``RelayConformance``."""

    # -- retention and backpressure -------------------------------------------------------------------

    async def test_full_inbox_refuses_and_stores_nothing(self) -> None:
        async with self.make_relays(1, Limits(inbox_cap=3)) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(3)]
            with pytest.raises(InboxFull) as full:
                await relay.send("alice", "bob", self.body(3))
            assert full.value.agent == "bob" and full.value.cap == 3 and full.value.depth == 3
            assert full.value.details() == {"agent": "bob", "cap": 3, "depth": 3}
            assert "bob" in str(full.value) and "cap in force is 3" in str(full.value)
            got = await relay.fetch("bob", 16)
            assert [e.id for e in got] == [e.id for e in sent]
            await relay.ack("bob", [sent[0].id])
            later = await relay.send("alice", "bob", self.body(4))
            assert [e.id for e in await relay.fetch("bob", 16)] == [e.id for e in sent[1:]] + [later.id]

    async def test_acknowledged_envelopes_are_not_kept(self) -> None:
        async with self.make_relays(1, Limits(inbox_cap=2)) as (relay,):
            await self._agents(relay, "alice", "bob")
            for round_ in range(5):
                sent = [await relay.send("alice", "bob", self.body(round_ * 2 + i)) for i in range(2)]
                await relay.fetch("bob", 16)
                assert len((await relay.ack("bob", [e.id for e in sent])).acknowledged) == 2
            assert await relay.fetch("bob", 16) == []

    async def test_send_rate_is_limited_per_agent_across_relays(self) -> None:
        async with self.make_relays(2, Limits(send_rate=0.5, send_burst=3)) as (one, two):
            await self._agents(one, "alice", "bob", "carol")
            await one.send("alice", "bob", self.body(0))
            await two.send("alice", "bob", self.body(1))
            await one.send("alice", "carol", self.body(2))
            with pytest.raises(RateLimited) as limited:
                await two.send("alice", "bob", self.body(3))
            assert 0 < limited.value.retry_after <= 2.0
            assert limited.value.retryable
            await one.send("carol", "bob", self.body(4))
            got = await one.fetch("bob", 16)
            assert [e.message for e in got] == [self.body(0), self.body(1), self.body(4)]

    # -- parked fetches: caps, session re-check, shutdown --------------------------------------------

    async def test_parked_fetches_are_capped_per_agent_and_others_still_wait(self) -> None:
        async with self.make_relays(1, Limits(max_waits_per_agent=2)) as (relay,):
            await self._agents(relay, "alice", "bob", "carol")
            parked = [asyncio.create_task(relay.fetch("bob", 16, wait=20.0)) for _ in range(2)]
            await self._until_parked(relay, "bob", 2)
            with pytest.raises(TooManyWaits) as too_many:
                await relay.fetch("bob", 16, wait=20.0)
            refused = too_many.value
            assert refused.code == "too_many_waits" and refused.retryable and refused.cap == 2
            assert "2" in refused.message and "bob" in refused.message
            other = asyncio.create_task(relay.fetch("carol", 16, wait=20.0))
            to_carol = await relay.send("alice", "carol", self.body(1))
            assert [e.id for e in await asyncio.wait_for(other, _WAIT_BOUND)] == [to_carol.id]
            to_bob = await relay.send("alice", "bob", self.body(2))
            for task in parked:
                assert [e.id for e in await asyncio.wait_for(task, _WAIT_BOUND)] == [to_bob.id]

    async def test_parked_fetches_are_capped_in_total(self) -> None:
        async with self.make_relays(1, Limits(max_waits=2)) as (relay,):
            await self._agents(relay, "alice", "bob", "carol", "dave")
            parked = [asyncio.create_task(relay.fetch(a, 16, wait=20.0)) for a in ("bob", "carol")]
            await self._until_parked(relay, "bob", 1)
            await self._until_parked(relay, "carol", 1)
            assert relay.parked_fetches() == 2
            with pytest.raises(TooManyWaits) as too_many:
                await relay.fetch("dave", 16, wait=20.0)
            assert too_many.value.cap == 2 and too_many.value.retryable
            assert await relay.fetch("dave", 16) == []  # a fetch that does not wait is never refused
            for agent in ("bob", "carol"):
                await relay.send("alice", agent, self.body(0))
            for task in parked:
                assert len(await asyncio.wait_for(task, _WAIT_BOUND)) == 1

    async def test_a_parked_fetch_of_a_superseded_session_gets_no_mail(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            await relay.register("bob", self.address(Tier.HOST, "bob"), "old")
            parked = asyncio.create_task(relay.fetch("bob", 16, wait=20.0, session="old"))
            await self._until_parked(relay, "bob", 1)
            await relay.register("bob", self.address(Tier.HOST, "bob"), "new")
            sent = await relay.send("alice", "bob", self.body(0))
            with pytest.raises(SessionSuperseded):
                await asyncio.wait_for(parked, _WAIT_BOUND)
            got = await relay.fetch("bob", 16, session="new")
            assert [(e.id, e.deliveries) for e in got] == [(sent.id, 1)]

    async def test_stopping_answers_parked_fetches_at_once(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "bob")
            parked = asyncio.create_task(relay.fetch("bob", 16, wait=20.0))
            await self._until_parked(relay, "bob", 1)
            started = time.monotonic()
            await relay.stop()
            assert await asyncio.wait_for(parked, _WAIT_BOUND) == []
            assert time.monotonic() - started < 2.0

    async def test_a_send_refused_by_the_recipient_takes_no_rate_token(self) -> None:
        async with self.make_relays(1, Limits(inbox_cap=1, send_rate=0.01, send_burst=2)) as (relay,):
            await self._agents(relay, "alice", "bob")
            await relay.send("alice", "bob", self.body(0))
            for _ in range(3):
                with pytest.raises(UnknownRecipient):
                    await relay.send("alice", "nobody", self.body(1))
                with pytest.raises(InboxFull):
                    await relay.send("alice", "bob", self.body(2))
            await self._agents(relay, "carol", "dave")
            await relay.send("alice", "carol", self.body(3))  # the second token of the burst is still there
            with pytest.raises(RateLimited):
                await relay.send("alice", "dave", self.body(4))
