"""The messenger's part of the conformance suite: at-least-once in-process delivery on any backend.

Install and run it like ``broker.testing.conformance`` (``pip install relay[testing]``). Subclass it
in a test module (the class name must start with ``Test``) and implement the hooks::

    class TestMyMessenger(MessengerConformance[MyBody]):
        def make_messengers(self, count, settings): ...  # started messengers sharing one fresh store
        def body(self, n): ...                            # distinct valid bodies
        def address(self, tier, agent): ...               # an address of that tier

Every wait is bounded; conditions are polled in counted loops, never slept on.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

import pytest

from broker.addresses import Address
from broker.delivery import DeliverySettings
from broker.envelope import Envelope, Tier
from broker.errors import UnknownRecipient, UnregisteredAgent
from broker.messenger import Delivery, Messenger, Receiving
from broker.testing.polling import eventually

Body = TypeVar("Body")

_BOUND = 10.0  # seconds any single awaited step may take before the test fails
FAST = DeliverySettings(max_attempts=3, visibility=30.0, backoff_base=0.01, backoff_cap=0.05, poll=0.2)
"""Quick retries, and a visibility timeout long enough that no test reclaims by accident."""


class MessengerConformance(ABC, Generic[Body]):
    """The conformance tests; see the module docstring for the hooks."""

    # -- hooks ------------------------------------------------------------------------------------

    @abstractmethod
    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[Body]]]:
        """``count`` started messengers, each on its own started relay, all sharing one fresh store
        (like processes on one Redis)."""

    @abstractmethod
    def body(self, n: int) -> Body:
        """A valid body, distinct for each ``n``."""

    @abstractmethod
    def address(self, tier: Tier, agent: str) -> Address:
        """An address of ``tier`` for ``agent``."""

    # -- helpers ----------------------------------------------------------------------------------

    async def _agents(self, messenger: Messenger[Body], *names: str, tier: Tier = Tier.IN_PROCESS) -> None:
        for name in names:
            await messenger.register(name, self.address(tier, name), f"s-{name}")

    @staticmethod
    async def _take(receiving: Receiving[Body], count: int) -> list[Delivery[Body]]:
        got: list[Delivery[Body]] = []
        for _ in range(count):
            got.append(await asyncio.wait_for(anext(receiving), _BOUND))
        return got

    @staticmethod
    async def _nothing(messenger: Messenger[Body], agent: str, within: float = 0.3) -> bool:
        async with messenger.receive(agent, wait=within) as receiving:
            async for _ in receiving:
                return False
        return True

    @staticmethod
    def _dead_metric(messenger: Messenger[Body], tier: Tier) -> float:
        found = messenger.relay.metrics.registry.get_sample_value(
            "csf_relay_dead_letters_total", {"tier": tier.label}
        )
        return 0.0 if found is None else found

    # -- receive, ack -----------------------------------------------------------------------------

    async def test_receive_yields_envelopes_oldest_first(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = [await messenger.send("alice", "bob", self.body(i)) for i in range(5)]
            async with messenger.receive("bob", limit=2) as receiving:
                got = await self._take(receiving, 5)
            assert [d.envelope.id for d in got] == [e.id for e in sent]
            assert [d.envelope.message for d in got] == [self.body(i) for i in range(5)]
            assert all(d.attempt == 1 and d.envelope.deliveries == 1 for d in got)
            assert all(d.envelope.sender == "alice" and d.envelope.to == "bob" for d in got)
            assert all(d.envelope.tier is Tier.IN_PROCESS for d in got)
            assert [d.envelope.sent_at for d in got] == [e.sent_at for e in sent]

    async def test_ack_removes_for_good(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = await messenger.send("alice", "bob", self.body(0))
            async with messenger.receive("bob") as receiving:
                (delivery,) = await self._take(receiving, 1)
                assert delivery.envelope.id == sent.id
                assert await delivery.ack() is True
                assert await delivery.ack() is False
            assert await self._nothing(messenger, "bob")
            assert await messenger.relay.fetch("bob", 16) == []

    async def test_send_refusals_are_the_relays(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice")
            with pytest.raises(UnknownRecipient):
                await messenger.send("alice", "nobody", self.body(0))
            with pytest.raises(UnregisteredAgent):
                await messenger.send("ghost", "alice", self.body(0))
            with pytest.raises(UnregisteredAgent):
                async with messenger.receive("ghost", wait=0.1) as receiving:
                    await self._take(receiving, 1)

    async def test_tier_is_the_widest_in_process_too(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "bob")
            await self._agents(messenger, "cc", tier=Tier.HOST)
            sent = await messenger.send("cc", "bob", self.body(0))
            async with messenger.receive("bob") as receiving:
                (delivery,) = await self._take(receiving, 1)
            assert sent.tier is Tier.HOST and delivery.envelope.tier is Tier.HOST

    # -- failure, retry, dead letters, requeue ----------------------------------------------------

    async def test_fail_retries_with_the_next_attempt(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = await messenger.send("alice", "bob", self.body(0))
            async with messenger.receive("bob") as receiving:
                (first,) = await self._take(receiving, 1)
                assert await first.fail("RuntimeError: boom") == "retrying"
                (second,) = await self._take(receiving, 1)
                assert second.envelope.id == sent.id
                assert (second.attempt, second.envelope.deliveries) == (2, 2)
                assert second.envelope.message == self.body(0)
                assert await second.ack() is True
            assert await self._nothing(messenger, "bob")
            delivered = messenger.relay.metrics.registry.get_sample_value(
                "csf_relay_envelopes_delivered_total", {"tier": Tier.IN_PROCESS.label}
            )
            assert delivered == 1

    async def test_dead_letter_after_max_attempts(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = await messenger.send("alice", "bob", self.body(7))
            outcomes = []
            async with messenger.receive("bob") as receiving:
                for attempt in range(1, FAST.max_attempts + 1):
                    (delivery,) = await self._take(receiving, 1)
                    assert delivery.attempt == attempt
                    outcomes.append(await delivery.fail(f"RuntimeError: attempt {attempt}"))
            assert outcomes == ["retrying"] * (FAST.max_attempts - 1) + ["dead_lettered"]
            assert await messenger.dead_letter_count("bob") == 1
            (letter,) = await messenger.dead_letters("bob")
            assert letter.envelope_id == sent.id and letter.sender == "alice" and letter.to == "bob"
            assert letter.attempts == FAST.max_attempts
            assert letter.reason == f"RuntimeError: attempt {FAST.max_attempts}"
            assert letter.tier is Tier.IN_PROCESS and letter.sent_at_ms == int(
                sent.sent_at.timestamp() * 1000
            )
            assert messenger.relay.contract.from_fields(letter.fields) == self.body(7)
            assert self._dead_metric(messenger, Tier.IN_PROCESS) == 1
            assert await self._nothing(messenger, "bob")
            assert await messenger.relay.fetch("bob", 16) == []

    async def test_the_senders_status_follows_a_requeued_dead_letter(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = await messenger.send("alice", "bob", self.body(0))

            async def status() -> tuple[str, int | None, str | None]:
                (found,) = await messenger.relay.status("alice", [sent.id])
                assert (found.to, found.sent_at_ms) == ("bob", int(sent.sent_at.timestamp() * 1000))
                return found.state, found.deliveries, found.reason

            async def fail_all() -> None:
                async with messenger.receive("bob") as receiving:
                    for attempt in range(1, FAST.max_attempts + 1):
                        (delivery,) = await self._take(receiving, 1)
                        await delivery.fail(f"RuntimeError: attempt {attempt}")

            await fail_all()
            dead = ("dead_lettered", FAST.max_attempts, f"RuntimeError: attempt {FAST.max_attempts}")
            assert await status() == dead
            (again,) = await messenger.requeue("bob")
            assert await status() == ("queued", 0, None)
            await fail_all()  # dead-lettered a second time, and requeued again
            assert await status() == dead
            (third,) = await messenger.requeue("bob")
            assert third not in (sent.id, again)
            assert await status() == ("queued", 0, None)
            async with messenger.receive("bob") as receiving:
                (delivery,) = await self._take(receiving, 1)
                assert delivery.envelope.id == third
                assert await status() == ("delivered", 1, None)
                assert await delivery.ack()
            assert await status() == ("acknowledged", 1, None)
            # the recipient's ids of the requeued copies are not the sender's to ask about
            assert [s.state for s in await messenger.relay.status("alice", [again, third])] == ["unknown"] * 2

    async def test_serve_retries_until_success_then_acknowledges_once(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = await messenger.send("alice", "bob", self.body(0))
            calls: list[tuple[str, int]] = []
            stop = asyncio.Event()

            async def flaky(envelope: Envelope[Body]) -> None:
                calls.append((envelope.id, envelope.deliveries))
                if len(calls) <= 2:
                    raise RuntimeError("not yet")
                stop.set()

            await asyncio.wait_for(messenger.serve("bob", flaky, stop=stop), _BOUND)
            assert calls == [(sent.id, 1), (sent.id, 2), (sent.id, 3)]
            assert await self._nothing(messenger, "bob")
            assert await messenger.dead_letter_count("bob") == 0

    async def test_serve_dead_letters_what_always_fails_and_requeue_brings_it_back(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "alice", "bob")
            sent = [await messenger.send("alice", "bob", self.body(i)) for i in range(3)]
            stop = asyncio.Event()

            async def broken(envelope: Envelope[Body]) -> None:
                raise ValueError("never works")

            async def all_dead() -> bool:
                return await messenger.dead_letter_count("bob") == 3

            serving = asyncio.create_task(messenger.serve("bob", broken, stop=stop))
            try:
                await eventually(all_dead, _BOUND, "all three envelopes dead-lettered")
            finally:
                stop.set()
                await asyncio.wait_for(serving, _BOUND)
            letters = await messenger.dead_letters("bob")
            assert sorted(x.envelope_id for x in letters) == sorted(e.id for e in sent)
            assert all(x.attempts == FAST.max_attempts and x.reason.startswith("ValueError") for x in letters)
            assert self._dead_metric(messenger, Tier.IN_PROCESS) == 3

            first = letters[0].envelope_id
            (again,) = await messenger.requeue("bob", [first, "env_" + "0" * 26])
            assert again != first and await messenger.dead_letter_count("bob") == 2
            rest = await messenger.requeue("bob")
            assert len(rest) == 2 and await messenger.dead_letter_count("bob") == 0
            assert await messenger.requeue("bob") == []
            async with messenger.receive("bob") as receiving:
                got = await self._take(receiving, 3)
                for delivery in got:
                    assert await delivery.ack()
            assert [d.envelope.id for d in got] == [again, *rest]
            assert all(d.attempt == 1 and d.envelope.sender == "alice" for d in got)
            by_id = {e.id: e for e in sent}
            assert got[0].envelope.message == by_id[first].message
            assert got[0].envelope.sent_at == by_id[first].sent_at
            assert sorted(str(d.envelope.message) for d in got) == sorted(str(e.message) for e in sent)
            assert await self._nothing(messenger, "bob")

    # -- several loops, visibility ----------------------------------------------------------------

    async def test_two_loops_never_hold_the_same_envelope_at_once(self) -> None:
        count = 120
        async with self.make_messengers(2, FAST) as (one, two):
            await self._agents(one, "alice", "bob")
            sent = {(await one.send("alice", "bob", self.body(i))).id for i in range(count)}
            holding: set[str] = set()
            handled: list[str] = []
            overlaps: list[str] = []
            stop = asyncio.Event()

            async def handle(envelope: Envelope[Body]) -> None:
                if envelope.id in holding:
                    overlaps.append(envelope.id)
                holding.add(envelope.id)
                await asyncio.sleep(0)  # let the other loop run while this one holds the envelope
                holding.discard(envelope.id)
                handled.append(envelope.id)
                if len(handled) >= count:
                    stop.set()

            loops = [asyncio.create_task(m.serve("bob", handle, stop=stop, limit=8)) for m in (one, two)]
            await asyncio.wait_for(asyncio.gather(*loops), 60)
            assert overlaps == []
            assert sorted(handled) == sorted(sent)
            assert await self._nothing(two, "bob")

    async def test_an_abandoned_envelope_is_taken_over_after_the_visibility_timeout(self) -> None:
        quick = DeliverySettings(
            max_attempts=3, visibility=0.3, backoff_base=0.01, backoff_cap=0.05, poll=0.1
        )
        async with self.make_messengers(2, FAST) as (one, two):
            await self._agents(one, "alice", "bob")
            sent = await one.send("alice", "bob", self.body(0))
            dying = one.receive("bob")
            claimed_at = time.monotonic()
            (held,) = await self._take(dying, 1)  # never settled, never closed: its loop "died"
            assert await self._nothing(two, "bob", within=0.2)  # FAST: a 30 s visibility timeout
            reclaimer = Messenger(two.relay, two.queue, quick)
            async with reclaimer.receive("bob") as receiving:
                (taken,) = await self._take(receiving, 1)
                assert time.monotonic() - claimed_at >= 0.25
                assert taken.envelope.id == sent.id and taken.attempt == 2
                assert await taken.ack() is True
            assert await held.ack() is False
            assert await self._nothing(reclaimer, "bob")

    async def test_a_closed_loop_hands_back_what_it_did_not_hand_out(self) -> None:
        async with self.make_messengers(2, FAST) as (one, two):
            await self._agents(one, "alice", "bob")
            sent = [(await one.send("alice", "bob", self.body(i))).id for i in range(4)]
            async with one.receive("bob", limit=4) as receiving:
                (first,) = await self._take(receiving, 1)
            async with two.receive("bob", wait=2.0) as other:
                rest = await self._take(other, 3)
                for delivery in rest:
                    await delivery.ack()
            assert first.envelope.id == sent[0]
            assert [d.envelope.id for d in rest] == sent[1:]
            assert await first.ack() is True

    async def test_stop_ends_serve_promptly(self) -> None:
        async with self.make_messengers(1, DeliverySettings(poll=20.0)) as (messenger,):
            await self._agents(messenger, "bob")
            stop = asyncio.Event()

            async def handle(envelope: Envelope[Body]) -> None:
                raise AssertionError("nothing was sent")

            serving = asyncio.create_task(messenger.serve("bob", handle, stop=stop))
            await asyncio.sleep(0.05)  # let it block in its claim (not a synchronisation: any moment works)
            started = time.monotonic()
            stop.set()
            await asyncio.wait_for(serving, _BOUND)
            assert time.monotonic() - started < 2.0

    async def test_wait_bounds_an_idle_receive(self) -> None:
        async with self.make_messengers(1, FAST) as (messenger,):
            await self._agents(messenger, "bob")
            started = time.monotonic()
            assert await self._nothing(messenger, "bob", within=0.2)
            assert 0.15 <= time.monotonic() - started < _BOUND
