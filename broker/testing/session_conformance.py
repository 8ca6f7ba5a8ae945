"""The relay conformance tests of sessions: who may act for an agent once another session registers.
Part of ``RelayConformance`` (``broker.testing.conformance``)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

from broker.envelope import Tier
from broker.errors import SessionNotRegistered, SessionSuperseded
from broker.testing.base import WAIT_BOUND as _WAIT_BOUND
from broker.testing.base import ConformanceBase

Body = TypeVar("Body")


class SessionConformance(ConformanceBase[Body]):
    """The session tests; a backend runs them through ``RelayConformance``."""

    async def test_a_parked_fetch_of_a_superseded_session_is_refused_on_another_worker(self) -> None:
        async with self.make_relays(2) as (first, second):
            await self._agents(second, "alice")
            await second.register("bob", self.address(Tier.HOST, "bob"), "bob-2")
            parked = asyncio.create_task(first.fetch("bob", 16, wait=20.0, session="bob-2"))
            await self._until_parked(first, "bob", 1)
            await second.register("bob", self.address(Tier.HOST, "bob"), "bob-3")
            sent = await second.send("alice", "bob", self.body(0))
            with pytest.raises(SessionSuperseded):
                await asyncio.wait_for(parked, _WAIT_BOUND)
            got = await second.fetch("bob", 16, session="bob-3")
            assert [(e.id, e.deliveries) for e in got] == [(sent.id, 1)]

    async def test_superseding_answers_the_old_sessions_parked_fetch_at_once(self) -> None:
        async with self.make_relays(1) as (relay,):
            await relay.register("bob", self.address(Tier.HOST, "bob"), "bob-2")
            parked = asyncio.create_task(relay.fetch("bob", 16, wait=20.0, session="bob-2"))
            await self._until_parked(relay, "bob", 1)
            await relay.register("bob", self.address(Tier.HOST, "bob"), "bob-3")
            with pytest.raises(SessionSuperseded):
                await asyncio.wait_for(parked, _WAIT_BOUND)

    async def test_a_session_that_never_registered_is_told_to_register_first(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            await relay.register("bob", self.address(Tier.HOST, "bob"), "bob-1")
            sent = await relay.send("alice", "bob", self.body(0))
            calls = (
                relay.fetch("bob", 16, session="bob-new"),
                relay.fetch("bob", 16, wait=0.1, session="bob-new"),
                relay.ack("bob", [sent.id], session="bob-new"),
                relay.send("bob", "alice", self.body(1), session="bob-new"),
            )
            for call in calls:
                with pytest.raises(SessionNotRegistered) as refused:
                    await call
                assert refused.value.code == "session_not_registered"
                assert "RegisterAgentAddress" in refused.value.message
                assert "superseded" not in refused.value.message
            got = await relay.fetch("bob", 16, session="bob-1")
            assert [(e.id, e.deliveries) for e in got] == [(sent.id, 1)]  # nothing was handed out

    async def test_a_superseded_session_is_not_advised_to_take_the_inbox_back(self) -> None:
        async with self.make_relays(1) as (relay,):
            for session in ("bob-1", "bob-2", "bob-3"):
                await relay.register("bob", self.address(Tier.HOST, "bob"), session)
            for old in ("bob-1", "bob-2"):
                with pytest.raises(SessionSuperseded) as refused:
                    await relay.fetch("bob", 16, session=old)
                assert "register again" not in refused.value.message
                assert "take over" not in refused.value.message
            await relay.register("bob", self.address(Tier.HOST, "bob"), "bob-1")  # a handover back
            assert await relay.fetch("bob", 16, session="bob-1") == []
            for old in ("bob-2", "bob-3"):
                with pytest.raises(SessionSuperseded):
                    await relay.fetch("bob", 16, session=old)
