"""The messaging contract every relay instantiation runs, whatever its body type and backend.

Install it with ``pip install relay[testing]`` (pytest and pytest-asyncio; the tests are coroutines,
so run them with ``asyncio_mode = "auto"`` or a loop-scope setting of your own). Use it by subclassing
in a test module (the class name must start with ``Test``) and implementing the hooks; pytest collects
every ``test_*`` method::

    class TestMyRelay(RelayConformance[MyBody]):
        def make_relays(self, count): ...   # started relays sharing one fresh, empty store
        def body(self, n): ...              # distinct valid bodies
        def invalid_body(self): ...         # a body the contract refuses
        def address(self, tier, agent): ... # an address of that tier

Every test is bounded: waits are short and capped, loops are counted.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from itertools import product
from typing import TypeVar

import pytest

from broker.envelope import Tier, widest
from broker.errors import (
    ContractViolation,
    InvalidArgument,
    SessionSuperseded,
    UnknownRecipient,
    UnregisteredAgent,
)
from broker.testing.base import WAIT_BOUND as _WAIT_BOUND
from broker.testing.base import ConformanceBase
from broker.testing.delivery_conformance import DeliveryConformance
from broker.testing.limits_conformance import LimitsConformance
from broker.testing.session_conformance import SessionConformance

Body = TypeVar("Body")


class RelayConformance(
    DeliveryConformance[Body], LimitsConformance[Body], SessionConformance[Body], ConformanceBase[Body]
):
    """The conformance tests; see the module docstring for the hooks (``ConformanceBase``)."""

    # -- ordering, limit, fetch-until-ack ---------------------------------------------------------

    async def test_fetch_returns_oldest_first(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(5)]
            got = await relay.fetch("bob", 16)
            assert [e.id for e in got] == [e.id for e in sent]
            assert [e.message for e in got] == [self.body(i) for i in range(5)]
            assert all(e.sender == "alice" and e.to == "bob" for e in got)

    async def test_limit_caps_each_fetch(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(7)]
            first = await relay.fetch("bob", 3)
            assert [e.id for e in first] == [e.id for e in sent[:3]]
            more = await relay.fetch("bob", 5)
            assert [e.id for e in more] == [e.id for e in sent[:5]]

    async def test_same_envelopes_come_back_until_acknowledged(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(3)]
            for _ in range(3):
                assert [e.id for e in await relay.fetch("bob", 16)] == [e.id for e in sent]
            again = await relay.fetch("bob", 16)
            assert [e.deliveries for e in again] == [4, 4, 4]
            result = await relay.ack("bob", [e.id for e in sent])
            assert set(result.acknowledged) == {e.id for e in sent}
            assert await relay.fetch("bob", 16) == []

    async def test_new_envelopes_follow_pending_ones(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            first = await relay.send("alice", "bob", self.body(1))
            assert [e.id for e in await relay.fetch("bob", 16)] == [first.id]
            second = await relay.send("alice", "bob", self.body(2))
            assert [e.id for e in await relay.fetch("bob", 16)] == [first.id, second.id]

    # -- acknowledgement ----------------------------------------------------------------------------

    async def test_partial_and_repeated_ack(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(4)]
            await relay.fetch("bob", 16)
            first = await relay.ack("bob", [sent[0].id, sent[2].id])
            assert first.acknowledged == (sent[0].id, sent[2].id) and first.unknown == ()
            assert first.origins == (("alice", Tier.HOST), ("alice", Tier.HOST))
            assert [e.id for e in await relay.fetch("bob", 16)] == [sent[1].id, sent[3].id]
            repeat = await relay.ack("bob", [sent[0].id, sent[1].id])
            assert repeat.acknowledged == (sent[1].id,)
            assert repeat.unknown == (sent[0].id,)
            assert [e.id for e in await relay.fetch("bob", 16)] == [sent[3].id]

    async def test_ack_of_many_in_any_order_among_pending_others(self) -> None:
        # one acknowledgement naming envelopes out of order, with pending ones it does not name between
        # them, a forged id and one never sent: each is answered for itself, with its own deliveries
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(10)]
            await relay.fetch("bob", 3)
            await relay.fetch("bob", 16)  # the first 3 handed out twice, the rest once
            forged = sent[6].id[:-1] + ("0" if sent[6].id[-1] != "0" else "1")
            ghost = "env_" + "0" * 26
            named = [sent[8].id, sent[1].id, forged, sent[5].id, ghost, sent[2].id]
            result = await relay.ack("bob", named)
            assert result.acknowledged == (sent[8].id, sent[1].id, sent[5].id, sent[2].id)
            assert result.unknown == (forged, ghost)
            left = await relay.fetch("bob", 16)
            assert [e.id for e in left] == [sent[i].id for i in (0, 3, 4, 6, 7, 9)]
            assert [e.deliveries for e in left] == [3, 2, 2, 2, 2, 2]
            statuses = await relay.status("alice", [sent[1].id, sent[8].id, sent[0].id])
            assert [(s.state, s.deliveries) for s in statuses] == [
                ("acknowledged", 2),
                ("acknowledged", 1),
                ("delivered", 3),
            ]

    async def test_unknown_and_malformed_ids(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = await relay.send("alice", "bob", self.body(0))
            await relay.fetch("bob", 16)
            ghost = "env_" + "0" * 26
            result = await relay.ack("bob", [ghost])
            assert result.acknowledged == () and result.unknown == (ghost,)
            forged = sent.id[:-1] + ("0" if sent.id[-1] != "0" else "1")
            assert (await relay.ack("bob", [forged])).unknown == (forged,)
            for bad in ["", "nope", "env_*", "relay:inbox:{bob}", sent.id + "\n"]:
                with pytest.raises(InvalidArgument):
                    await relay.ack("bob", [sent.id, bad])
            assert [e.id for e in await relay.fetch("bob", 16)] == [sent.id]

    async def test_ack_of_undelivered_envelope_is_unknown(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = await relay.send("alice", "bob", self.body(0))
            assert (await relay.ack("bob", [sent.id])).unknown == (sent.id,)
            assert [e.id for e in await relay.fetch("bob", 16)] == [sent.id]

    async def test_agent_can_only_ack_its_own_envelopes(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob", "mallory")
            sent = await relay.send("alice", "bob", self.body(0))
            await relay.fetch("bob", 16)
            assert (await relay.ack("mallory", [sent.id])).unknown == (sent.id,)
            assert [e.id for e in await relay.fetch("bob", 16)] == [sent.id]

    # -- tiers --------------------------------------------------------------------------------------

    async def test_tier_is_the_widest_for_every_pair(self) -> None:
        async with self.make_relays(1) as (relay,):
            for a, b in product(Tier, Tier):
                sender, recipient = f"s-{a.label}-{b.label}", f"r-{a.label}-{b.label}"
                await relay.register(sender, self.address(a, sender), "s1")
                await relay.register(recipient, self.address(b, recipient), "s1")
                sent = await relay.send(sender, recipient, self.body(0))
                assert sent.tier == widest(a, b) == max(a, b)
                (got,) = await relay.fetch(recipient, 16)
                assert got.tier == sent.tier

    # -- refusals store nothing -----------------------------------------------------------------------

    async def test_contract_refusal_stores_nothing(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            with pytest.raises(ContractViolation) as refused:
                await relay.send("alice", "bob", self.invalid_body())
            assert refused.value.violations
            assert all(v.rule for v in refused.value.violations)
            assert await relay.fetch("bob", 16) == []

    async def test_unknown_recipient_stores_nothing(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            with pytest.raises(UnknownRecipient):
                await relay.send("alice", "nobody", self.body(0))
            assert await relay.registration("nobody") is None
            assert [r.agent for r in await relay.registrations()] == ["alice"]
            await self._agents(relay, "nobody")
            assert await relay.fetch("nobody", 16) == []

    async def test_unregistered_sender_is_refused(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "bob")
            with pytest.raises(UnregisteredAgent):
                await relay.send("ghost", "bob", self.body(0))
            with pytest.raises(UnregisteredAgent):
                await relay.fetch("ghost", 16)
            assert await relay.fetch("bob", 16) == []

    async def test_invalid_agent_ids_are_refused(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            for bad in ["", "Bob", "b:ob", "b*", "{bob}", "b ob", "b\nob", "bö", "x" * 65]:
                with pytest.raises(InvalidArgument):
                    await relay.send("alice", bad, self.body(0))
                with pytest.raises(InvalidArgument):
                    await relay.register(bad, self.address(Tier.HOST, "x"), "s1")
            assert [r.agent for r in await relay.registrations()] == ["alice", "bob"]

    async def test_fetch_limit_is_checked(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "bob")
            for bad in [0, -1, 257]:
                with pytest.raises(InvalidArgument):
                    await relay.fetch("bob", bad)

    # -- registrations ------------------------------------------------------------------------------

    async def test_register_is_an_upsert(self) -> None:
        async with self.make_relays(1) as (relay,):
            first = await relay.register("bob", self.address(Tier.HOST, "bob"), "s1")
            assert first.created and first.superseded_session is None
            again = await relay.register("bob", self.address(Tier.NETWORK, "bob"), "s1")
            assert not again.created and again.superseded_session is None
            found = await relay.registration("bob")
            assert found is not None
            assert found.tier == Tier.NETWORK and found.session == "s1"
            assert found.registered_at == first.registration.registered_at
            assert found.updated_at >= first.registration.updated_at

    async def test_new_session_supersedes_and_keeps_the_inbox(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            await relay.register("bob", self.address(Tier.HOST, "bob"), "old")
            sent = [await relay.send("alice", "bob", self.body(i)) for i in range(3)]
            await relay.fetch("bob", 1, session="old")
            outcome = await relay.register("bob", self.address(Tier.HOST, "bob"), "new")
            assert outcome.superseded_session == "old"
            with pytest.raises(SessionSuperseded):
                await relay.fetch("bob", 16, session="old")
            with pytest.raises(SessionSuperseded):
                await relay.ack("bob", [sent[0].id], session="old")
            with pytest.raises(SessionSuperseded):
                await relay.send("bob", "alice", self.body(9), session="old")
            got = await relay.fetch("bob", 16, session="new")
            assert [e.id for e in got] == [e.id for e in sent]

    # -- blocking fetch -----------------------------------------------------------------------------

    async def test_blocking_fetch_returns_as_soon_as_a_message_arrives(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            started = time.monotonic()
            waiting = asyncio.create_task(relay.fetch("bob", 16, wait=20.0))
            sent = await relay.send("alice", "bob", self.body(0))
            got = await asyncio.wait_for(waiting, _WAIT_BOUND)
            assert [e.id for e in got] == [sent.id]
            assert time.monotonic() - started < _WAIT_BOUND

    async def test_blocking_fetch_returns_empty_after_the_wait(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "bob")
            started = time.monotonic()
            assert await asyncio.wait_for(relay.fetch("bob", 16, wait=0.2), _WAIT_BOUND) == []
            assert 0.15 <= time.monotonic() - started < _WAIT_BOUND

    async def test_blocking_fetch_returns_pending_without_waiting(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = await relay.send("alice", "bob", self.body(0))
            await relay.fetch("bob", 16)
            started = time.monotonic()
            got = await asyncio.wait_for(relay.fetch("bob", 16, wait=20.0), _WAIT_BOUND)
            assert [e.id for e in got] == [sent.id]
            assert time.monotonic() - started < 2.0

    # -- concurrency, uniqueness, sharing -----------------------------------------------------------

    async def test_concurrent_senders_lose_and_duplicate_nothing(self) -> None:
        senders, each = 8, 200
        async with self.make_relays(1) as (relay,):
            names = [f"sender-{i}" for i in range(senders)]
            await self._agents(relay, "sink", *names)

            async def burst(name: str, base: int) -> list[str]:
                return [(await relay.send(name, "sink", self.body(base + n))).id for n in range(each)]

            batches = await asyncio.wait_for(
                asyncio.gather(*(burst(n, i * each) for i, n in enumerate(names))), 60
            )
            sent_ids = [i for batch in batches for i in batch]
            assert len(set(sent_ids)) == senders * each
            received: list[str] = []
            for _ in range(senders * each // 256 + 2):
                got = await relay.fetch("sink", 256)
                if not got:
                    break
                received.extend(e.id for e in got)
                ack = await relay.ack("sink", [e.id for e in got])
                assert len(ack.acknowledged) == len(got)
            assert sorted(received) == sorted(sent_ids)
            assert await relay.fetch("sink", 256) == []

    async def test_ids_are_unique_and_stable_from_send_to_fetch(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob", "carol")
            to_bob = [await relay.send("alice", "bob", self.body(i)) for i in range(20)]
            to_carol = [await relay.send("alice", "carol", self.body(i)) for i in range(20)]
            ids = [e.id for e in to_bob + to_carol]
            assert len(set(ids)) == len(ids)
            assert [e.id for e in await relay.fetch("bob", 32)] == [e.id for e in to_bob]
            assert [e.id for e in await relay.fetch("carol", 32)] == [e.id for e in to_carol]

    async def test_sent_at_is_utc_with_millisecond_precision(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            before = datetime.now(UTC)
            sent = await relay.send("alice", "bob", self.body(0))
            (got,) = await relay.fetch("bob", 1)
            assert sent.sent_at.tzinfo is not None and sent.sent_at.utcoffset() is not None
            assert sent.sent_at == got.sent_at
            assert sent.sent_at.microsecond % 1000 == 0
            assert abs((sent.sent_at - before).total_seconds()) < 5

    async def test_relays_sharing_a_store_see_the_same_inboxes(self) -> None:
        async with self.make_relays(2) as (one, two):
            await self._agents(one, "alice", "bob")
            waiting = asyncio.create_task(one.fetch("bob", 16, wait=20.0))
            sent = await two.send("alice", "bob", self.body(0))
            assert [e.id for e in await asyncio.wait_for(waiting, _WAIT_BOUND)] == [sent.id]
            assert [e.id for e in await two.fetch("bob", 16)] == [sent.id]
            assert (await two.ack("bob", [sent.id])).acknowledged == (sent.id,)
            assert await one.fetch("bob", 16) == []

    # -- metrics ------------------------------------------------------------------------------------

    async def test_metrics_count_sends_and_first_deliveries(self) -> None:
        async with self.make_relays(1) as (relay,):
            await relay.register("wb", self.address(Tier.IN_PROCESS, "wb"), "s1")
            await relay.register("cc", self.address(Tier.HOST, "cc"), "s1")
            for i in range(3):
                await relay.send("wb", "cc", self.body(i))
            await relay.send("wb", "wb", self.body(9))
            for _ in range(3):
                await relay.fetch("cc", 16)
            await relay.fetch("wb", 16)
            registry = relay.metrics.registry

            def value(name: str, tier: Tier) -> float:
                found = registry.get_sample_value(name, {"tier": tier.label})
                return 0.0 if found is None else found

            assert value("csf_relay_envelopes_sent_total", Tier.HOST) == 3
            assert value("csf_relay_envelopes_sent_total", Tier.IN_PROCESS) == 1
            assert value("csf_relay_envelopes_sent_total", Tier.NETWORK) == 0
            assert value("csf_relay_envelopes_delivered_total", Tier.HOST) == 3
            assert value("csf_relay_envelopes_delivered_total", Tier.IN_PROCESS) == 1
