"""The mail-pending notice contract (``broker.ports.INoticeStore``) as ``Relay.wait_for_mail`` shows it.

Run it like ``RelayConformance`` (``broker.testing.conformance``): subclass, implement the hooks of
``ConformanceBase``, and build the relays with a notice store. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import pytest

from broker.envelope import Tier
from broker.errors import SessionNotRegistered, SessionSuperseded, TooManyWaits, UnregisteredAgent
from broker.limits import NOTICE_LISTED
from broker.relay import MailNotice, Relay
from broker.testing.base import WAIT_BOUND, ConformanceBase, Limits

Body = TypeVar("Body")

QUIET = 0.3
"""Seconds a wait that must find nothing is given (it returns empty when they pass)."""


class NoticeConformance(ConformanceBase[Body]):
    @staticmethod
    async def _wait(relay: Relay[Body], agent: str) -> MailNotice[Body]:
        return await asyncio.wait_for(relay.wait_for_mail(agent, f"s-{agent}", WAIT_BOUND), 2 * WAIT_BOUND)

    async def test_each_arrival_is_announced_once(self) -> None:
        async with self.make_relays(2) as (one, two):
            await self._agents(one, "alice", "bob")
            sent = [await one.send("alice", "bob", self.body(i)) for i in range(2)]
            notice = await one.wait_for_mail("bob", "s-bob", WAIT_BOUND)
            assert (notice.count, notice.unacknowledged, notice.reminder) == (2, 2, False)
            assert [e.id for e in notice.envelopes] == [e.id for e in sent]
            assert [(e.sender, e.to, e.message, e.deliveries) for e in notice.envelopes] == [
                ("alice", "bob", self.body(i), 0) for i in range(2)
            ]
            for relay in (one, two):  # re-armed, on either worker: nothing new
                again = await relay.wait_for_mail("bob", "s-bob", QUIET)
                assert (again.count, again.unacknowledged, again.envelopes) == (0, 2, ())
            parked = asyncio.create_task(two.wait_for_mail("bob", "s-bob", 20.0))
            await self._until_parked(two, "bob", 1)
            third = await one.send("alice", "bob", self.body(2))
            woken = await asyncio.wait_for(parked, WAIT_BOUND)
            assert (woken.count, woken.unacknowledged) == (1, 3)
            assert [e.id for e in woken.envelopes] == [third.id]

    async def test_a_notice_lists_the_oldest_few_and_counts_all(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(NOTICE_LISTED + 3)]
            notice = await relay.wait_for_mail("bob", "s-bob", 0)
            assert notice.count == NOTICE_LISTED + 3
            assert [e.id for e in notice.envelopes] == [e.id for e in sent[:NOTICE_LISTED]]

    async def test_a_notice_consumes_nothing(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(3)]
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 3
            # announced but never fetched: not delivered, so not acknowledgeable
            assert (await relay.ack("bob", [sent[0].id])).unknown == (sent[0].id,)
            first = await relay.fetch("bob", 16)
            assert [(e.id, e.deliveries) for e in first] == [(e.id, 1) for e in sent]
            await relay.send("alice", "bob", self.body(3))
            for _ in range(3):
                await relay.wait_for_mail("bob", "s-bob", 0)
            again = await relay.fetch("bob", 16)
            assert [e.deliveries for e in again] == [2, 2, 2, 1]
            done = await relay.ack("bob", [e.id for e in again])
            assert len(done.acknowledged) == 4
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).unacknowledged == 0

    async def test_unacknowledged_mail_is_reminded_once_per_interval(self) -> None:
        async with self.make_relays(1, Limits(remind_after=0.5)) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = await relay.send("alice", "bob", self.body(0))
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 1
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 0  # within the interval
            reminded = await self._wait(relay, "bob")  # parks until the reminder falls due
            assert (reminded.count, reminded.reminder, reminded.unacknowledged) == (1, True, 1)
            assert [e.id for e in reminded.envelopes] == [sent.id]
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 0
            got = await relay.fetch("bob", 16)
            await relay.ack("bob", [e.id for e in got])
            quiet = await relay.wait_for_mail("bob", "s-bob", 1.0)  # nothing left to remind of
            assert (quiet.count, quiet.unacknowledged) == (0, 0)

    async def test_no_reminder_when_the_interval_is_zero(self) -> None:
        async with self.make_relays(1, Limits(remind_after=0)) as (relay,):
            await self._agents(relay, "alice", "bob")
            await relay.send("alice", "bob", self.body(0))
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 1
            quiet = await relay.wait_for_mail("bob", "s-bob", QUIET)
            assert (quiet.count, quiet.unacknowledged) == (0, 1)

    async def test_a_superseded_sessions_wait_is_refused(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            await relay.register("bob", self.address(Tier.HOST, "bob"), "old")
            first = await relay.send("alice", "bob", self.body(0))
            assert (await relay.wait_for_mail("bob", "old", 0)).count == 1
            parked = asyncio.create_task(relay.wait_for_mail("bob", "old", 20.0))
            await self._until_parked(relay, "bob", 1)
            await relay.register("bob", self.address(Tier.HOST, "bob"), "new")
            second = await relay.send("alice", "bob", self.body(1))
            with pytest.raises(SessionSuperseded):
                await asyncio.wait_for(parked, WAIT_BOUND)
            with pytest.raises(SessionSuperseded):
                await relay.wait_for_mail("bob", "old", 0)
            # the new session was told nothing yet: both envelopes are news to it, once
            fresh = await relay.wait_for_mail("bob", "new", 0)
            assert [e.id for e in fresh.envelopes] == [first.id, second.id]
            assert (await relay.wait_for_mail("bob", "new", 0)).count == 0
            with pytest.raises(UnregisteredAgent):
                await relay.wait_for_mail("nobody", "s-1", 0)

    async def test_a_wait_of_a_session_that_never_registered_is_told_to_register_first(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            for session in ("bob-1", "bob-2"):
                await relay.register("bob", self.address(Tier.HOST, "bob"), session)
            await relay.send("alice", "bob", self.body(0))
            for wait in (0, 0.1):
                with pytest.raises(SessionNotRegistered) as refused:
                    await relay.wait_for_mail("bob", "bob-new", wait)
                assert refused.value.code == "session_not_registered"
                assert "RegisterAgentAddress" in refused.value.message
                with pytest.raises(SessionSuperseded):  # a replaced session is told so
                    await relay.wait_for_mail("bob", "bob-1", wait)
            # neither refusal moved the cursor: the live session is told about the envelope once
            assert (await relay.wait_for_mail("bob", "bob-2", 0)).count == 1
            assert (await relay.wait_for_mail("bob", "bob-2", 0)).count == 0

    async def test_many_waiters_each_woken_by_their_own_mail(self) -> None:
        async with self.make_relays(2) as (one, two):
            agents = [f"agent-{i}" for i in range(20)]
            await self._agents(one, "alice", *agents)
            waits = {
                agent: asyncio.create_task((one if i % 2 else two).wait_for_mail(agent, f"s-{agent}", 20.0))
                for i, agent in enumerate(agents)
            }
            for i, agent in enumerate(agents):
                await self._until_parked(one if i % 2 else two, agent, 1)
            sent = {agent: await one.send("alice", agent, self.body(i)) for i, agent in enumerate(agents)}
            for agent, task in waits.items():
                notice = await asyncio.wait_for(task, WAIT_BOUND)
                assert [e.id for e in notice.envelopes] == [sent[agent].id]

    async def test_two_waiters_of_one_agent_are_told_once(self) -> None:
        async with self.make_relays(2) as (one, two):
            await self._agents(one, "alice", "bob")
            tasks = [asyncio.create_task(r.wait_for_mail("bob", "s-bob", 2.0)) for r in (one, two)]
            await self._until_parked(one, "bob", 1)
            await self._until_parked(two, "bob", 1)
            await one.send("alice", "bob", self.body(0))
            counts = sorted(n.count for n in await asyncio.wait_for(asyncio.gather(*tasks), 2 + WAIT_BOUND))
            assert counts == [0, 1]

    async def test_parked_waits_share_the_fetch_caps(self) -> None:
        async with self.make_relays(1, Limits(max_waits_per_agent=2)) as (relay,):
            await self._agents(relay, "alice", "bob", "carol")
            parked = [
                asyncio.create_task(relay.wait_for_mail("bob", "s-bob", 20.0)),
                asyncio.create_task(relay.fetch("bob", 16, wait=20.0)),
            ]
            await self._until_parked(relay, "bob", 2)
            with pytest.raises(TooManyWaits):
                await relay.wait_for_mail("bob", "s-bob", 20.0)
            assert (await relay.wait_for_mail("bob", "s-bob", 0)).count == 0  # not parking: never refused
            other = asyncio.create_task(relay.wait_for_mail("carol", "s-carol", 20.0))
            await relay.send("alice", "carol", self.body(0))
            assert (await asyncio.wait_for(other, WAIT_BOUND)).count == 1
            await relay.send("alice", "bob", self.body(1))
            notice, fetched = await asyncio.wait_for(asyncio.gather(*parked), WAIT_BOUND)
            assert isinstance(notice, MailNotice) and notice.count == 1
            assert isinstance(fetched, list) and len(fetched) == 1

    async def test_stopping_answers_parked_waits_at_once(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "bob")
            parked = asyncio.create_task(relay.wait_for_mail("bob", "s-bob", 20.0))
            await self._until_parked(relay, "bob", 1)
            started = time.monotonic()
            await relay.stop()
            assert (await asyncio.wait_for(parked, WAIT_BOUND)).count == 0
            assert time.monotonic() - started < 2.0
