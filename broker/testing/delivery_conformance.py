"""The relay conformance tests of delivery you can reason about: idempotent send, expiry, the poison
limit (max deliveries) and the sender's status. Part of ``RelayConformance``
(``broker.testing.conformance``).

Time is driven by a ``FakeClock`` given to the relays and the store (``Limits.clock``), so nothing
sleeps: the store judges expiry and status retention by that clock.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

from broker.envelope import now_ms
from broker.errors import IdempotencyConflict, InboxFull, InvalidArgument, RateLimited, UnknownRecipient
from broker.limits import DEFAULT_STATUS_RETENTION_MS, MAX_STATUS_IDS, MAX_TTL_MS
from broker.testing.base import ConformanceBase, Limits

Body = TypeVar("Body")


class FakeClock:
    """Milliseconds since the epoch that move only when told to (starts at the real time, so Redis
    entry ids, which carry the server's time, stay close to it)."""

    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def forge(envelope_id: str, place: int) -> str:
    """``envelope_id`` with one character of its stream position changed (``place`` 4-13: the
    milliseconds, 14-19: the sequence number): the same nonce at another position."""
    digit = "1" if envelope_id[place] != "1" else "2"
    return envelope_id[:place] + digit + envelope_id[place + 1 :]


class DeliveryConformance(ConformanceBase[Body]):
    """The delivery-rule tests; a backend runs them through ``RelayConformance``."""

    # -- idempotent send ------------------------------------------------------------------------------

    async def test_a_repeated_idempotency_key_returns_the_first_result_and_stores_nothing(self) -> None:
        async with self.make_relays(2) as (one, two):
            await self._agents(one, "alice", "bob")
            first = await one.send("alice", "bob", self.body(1), idempotency_key="req-1")
            again = await two.send("alice", "bob", self.body(1), idempotency_key="req-1")
            assert (again.id, again.sent_at, again.tier) == (first.id, first.sent_at, first.tier)
            got = await one.fetch("bob", 16)
            assert [e.id for e in got] == [first.id]
            await one.ack("bob", [first.id])
            third = await one.send("alice", "bob", self.body(1), idempotency_key="req-1")
            assert third.id == first.id
            assert await one.fetch("bob", 16) == []

    async def test_a_repeated_key_with_another_request_is_a_conflict(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob", "carol")
            first = await relay.send("alice", "bob", self.body(1), idempotency_key="k:1")
            others = [
                ("bob", self.body(2), None),
                ("carol", self.body(1), None),
                ("bob", self.body(1), 60_000),
            ]
            for to, body, ttl in others:
                with pytest.raises(IdempotencyConflict) as conflict:
                    await relay.send("alice", to, body, idempotency_key="k:1", ttl_ms=ttl)
                assert conflict.value.code == "idempotency_conflict"
            assert [e.id for e in await relay.fetch("bob", 16)] == [first.id]
            assert await relay.fetch("carol", 16) == []

    async def test_concurrent_repeats_store_one_envelope(self) -> None:
        async with self.make_relays(2) as relays:
            await self._agents(relays[0], "alice", "bob")
            sends = (
                relays[i % 2].send("alice", "bob", self.body(1), idempotency_key="burst") for i in range(12)
            )
            results = await asyncio.gather(*sends)
            assert len({(r.id, r.sent_at) for r in results}) == 1
            assert [e.id for e in await relays[0].fetch("bob", 16)] == [results[0].id]

    async def test_idempotency_keys_are_per_sender(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob", "carol")
            a = await relay.send("alice", "bob", self.body(1), idempotency_key="same")
            c = await relay.send("carol", "bob", self.body(1), idempotency_key="same")
            assert a.id != c.id
            assert len(await relay.fetch("bob", 16)) == 2

    async def test_a_refused_send_does_not_use_its_key_up(self) -> None:
        async with self.make_relays(1, Limits(send_rate=0.001, send_burst=1)) as (relay,):
            await self._agents(relay, "alice", "bob")
            with pytest.raises(UnknownRecipient):
                await relay.send("alice", "zed", self.body(1), idempotency_key="k")
            await self._agents(relay, "zed")
            sent = await relay.send("alice", "zed", self.body(1), idempotency_key="k")
            assert [e.id for e in await relay.fetch("zed", 16)] == [sent.id]
            # the refused send took no rate token, and a repeat takes none either
            again = await relay.send("alice", "zed", self.body(1), idempotency_key="k")
            assert again.id == sent.id
            with pytest.raises(RateLimited):
                await relay.send("alice", "bob", self.body(2))

    async def test_bad_send_options_are_refused_by_name(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice", "bob")
            for key in ("", "has space", "brace{x}", "x" * 129, 7):
                with pytest.raises(InvalidArgument) as bad:
                    await relay.send("alice", "bob", self.body(1), idempotency_key=key)  # type: ignore[arg-type]
                assert bad.value.violation.field == "idempotency_key"
            for ttl in (999, MAX_TTL_MS + 1, 0, -5, True, 1.5e3):
                with pytest.raises(InvalidArgument) as bad:
                    await relay.send("alice", "bob", self.body(1), ttl_ms=ttl)  # type: ignore[arg-type]
                assert bad.value.violation.field == "ttl_ms"
            assert await relay.fetch("bob", 16) == []

    # -- expiry ---------------------------------------------------------------------------------------

    async def test_an_expired_envelope_is_never_handed_out(self) -> None:
        clock = FakeClock()
        async with self.make_relays(1, Limits(clock=clock)) as (relay,):
            await self._agents(relay, "alice", "bob")
            short = await relay.send("alice", "bob", self.body(1), ttl_ms=1000)
            long = await relay.send("alice", "bob", self.body(2), ttl_ms=60_000)
            plain = await relay.send("alice", "bob", self.body(3))
            clock.advance(999)
            got = await relay.fetch("bob", 16)
            assert [e.id for e in got] == [short.id, long.id, plain.id]
            expires = [e.expires_at and round(e.expires_at.timestamp() * 1000) for e in got]
            sent = [round(e.sent_at.timestamp() * 1000) for e in (short, long)]
            assert expires == [sent[0] + 1000, sent[1] + 60_000, None]
            clock.advance(501)
            assert [e.id for e in await relay.fetch("bob", 16)] == [long.id, plain.id]
            (status,) = await relay.status("alice", [short.id])
            assert (status.state, status.reason, status.to) == ("expired", "expired", "bob")
            assert status.deliveries == 1
            assert self._count(relay, "csf_relay_envelopes_expired_total") == 1
            assert (await relay.ack("bob", [short.id])).unknown == (short.id,)

    async def test_an_envelope_that_expires_unfetched_reads_expired_and_is_swept(self) -> None:
        clock = FakeClock()
        async with self.make_relays(1, Limits(clock=clock)) as (relay,):
            await self._agents(relay, "alice", "bob")
            gone = await relay.send("alice", "bob", self.body(1), ttl_ms=1000)
            kept = await relay.send("alice", "bob", self.body(2))
            clock.advance(1500)
            (status,) = await relay.status("alice", [gone.id])
            assert status.state == "expired"
            assert await relay.sweep() == 1
            assert await relay.sweep() == 0
            (status,) = await relay.status("alice", [gone.id])
            assert (status.state, status.deliveries) == ("expired", 0)
            assert [e.id for e in await relay.fetch("bob", 16)] == [kept.id]

    async def test_the_sweep_reaches_every_agent(self) -> None:
        clock = FakeClock()
        async with self.make_relays(1, Limits(inbox_cap=5, clock=clock)) as (relay,):
            agents = [f"agent-{i:04d}" for i in range(1002)]
            for start in range(0, len(agents), 100):
                chunk = agents[start : start + 100]
                await asyncio.gather(*(self._agents(relay, agent) for agent in chunk))
            last = agents[-1]  # sorts after the first thousand registrations
            for n in range(5):
                await relay.send(agents[0], last, self.body(n), ttl_ms=1000)
            with pytest.raises(InboxFull):
                await relay.send(agents[0], last, self.body(5))
            clock.advance(1500)
            assert await relay.sweep() == 5
            sent = await relay.send(agents[0], last, self.body(6))
            assert [e.id for e in await relay.fetch(last, 16)] == [sent.id]

    # -- poison limit ---------------------------------------------------------------------------------

    async def test_an_envelope_handed_out_max_deliveries_times_is_dead_lettered(self) -> None:
        async with self.make_relays(1, Limits(max_deliveries=3)) as (relay,):
            await self._agents(relay, "alice", "bob")
            poison = await relay.send("alice", "bob", self.body(1))
            for n in (1, 2, 3):
                got = await relay.fetch("bob", 16)
                assert [(e.id, e.deliveries) for e in got] == [(poison.id, n)]
            later = await relay.send("alice", "bob", self.body(2))
            assert [e.id for e in await relay.fetch("bob", 16)] == [later.id]
            (status,) = await relay.status("alice", [poison.id])
            assert (status.state, status.reason, status.deliveries) == ("dead_lettered", "max_deliveries", 3)
            assert self._count(relay, "csf_relay_dead_letters_total") == 1

    # -- status ---------------------------------------------------------------------------------------

    async def test_status_follows_an_envelope_and_only_its_sender_learns_it(self) -> None:
        async with self.make_relays(2) as (one, two):
            await self._agents(one, "alice", "bob", "mallory")
            sent = await one.send("alice", "bob", self.body(1))

            async def state() -> tuple[str, int | None]:
                (status,) = await two.status("alice", [sent.id])
                assert (status.envelope_id, status.to, status.sent_at_ms) == (
                    sent.id,
                    "bob",
                    round(sent.sent_at.timestamp() * 1000),
                )
                return status.state, status.deliveries

            assert await state() == ("queued", 0)
            await one.fetch("bob", 16)
            assert await state() == ("delivered", 1)
            await one.fetch("bob", 16)
            assert await state() == ("delivered", 2)
            await one.ack("bob", [sent.id])
            assert await state() == ("acknowledged", 2)  # the hand-outs are kept after the ack
            for asker in ("bob", "mallory"):
                (other,) = await one.status(asker, [sent.id])
                assert (other.state, other.to, other.deliveries, other.sent_at_ms) == (
                    "unknown",
                    None,
                    None,
                    None,
                )

    async def test_status_of_unknown_and_old_ids_is_unknown(self) -> None:
        clock = FakeClock()
        async with self.make_relays(1, Limits(clock=clock)) as (relay,):
            await self._agents(relay, "alice", "bob")
            sent = await relay.send("alice", "bob", self.body(1))
            made_up = sent.id[:-10] + ("A" if sent.id[-10] != "A" else "B") + sent.id[-9:]
            statuses = await relay.status("alice", [sent.id, made_up, sent.id])
            assert [s.state for s in statuses] == ["queued", "unknown", "queued"]
            clock.advance(DEFAULT_STATUS_RETENTION_MS + 60_000)
            assert [s.state for s in await relay.status("alice", [sent.id])] == ["unknown"]

    async def test_the_senders_own_nonce_at_another_position_is_unknown(self) -> None:
        async with self.make_relays(1, Limits(max_deliveries=1)) as (relay,):
            await self._agents(relay, "alice", "bob")
            acked = await relay.send("alice", "bob", self.body(1))
            poison = await relay.send("alice", "bob", self.body(2))
            queued = await relay.send("alice", "bob", self.body(3))
            await relay.fetch("bob", 2)
            await relay.ack("bob", [acked.id])
            await relay.fetch("bob", 16)  # poison is dead-lettered instead of handed out again
            real = await relay.status("alice", [acked.id, poison.id, queued.id])
            assert [s.state for s in real] == ["acknowledged", "dead_lettered", "delivered"]
            forged = [forge(sent.id, place) for sent in (acked, poison, queued) for place in (13, 19)]
            for status in await relay.status("alice", forged):
                assert (status.state, status.to, status.deliveries, status.sent_at_ms, status.reason) == (
                    "unknown",
                    None,
                    None,
                    None,
                    None,
                ), status

    async def test_status_requests_are_bounded(self) -> None:
        async with self.make_relays(1) as (relay,):
            await self._agents(relay, "alice")
            sent = await relay.send("alice", "alice", self.body(1))
            for ids in ([], [sent.id] * (MAX_STATUS_IDS + 1), ["env_nope"], sent.id):
                with pytest.raises(InvalidArgument):
                    await relay.status("alice", ids)
            assert len(await relay.status("alice", [sent.id] * MAX_STATUS_IDS)) == MAX_STATUS_IDS

    @staticmethod
    def _count(relay: object, name: str) -> float:
        registry = relay.metrics.registry  # type: ignore[attr-defined]
        total = 0.0
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name == name:
                    total += sample.value
        return total
