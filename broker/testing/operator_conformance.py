"""The contract of ``broker.ports.IOperatorView`` (read-only operator queries), for every backend.

Subclass it in a test module (the class name must start with ``Test``) and implement the hooks::

    class TestMyView(OperatorViewConformance[MyBody]):
        def make_view(self): ...            # a started relay and a view of the same fresh store
        def body(self, n): ...              # distinct valid bodies
        def reply(self, n, envelope_id): ...# a valid body answering envelope_id (in_reply_to)
        def address(self, tier, agent): ... # an address of that tier

and, for the tests of requeued dead letters (skipped otherwise), ``make_view_and_queue``: the same
with the backend's ``IDeliveryQueue`` of that store; for the history tests (skipped otherwise),
``make_history_view(retention_ms, clock)``: the same, the stores keeping ``retention_ms`` of history
and judging expiry by ``clock`` (the relay keeps the real clock).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

import pytest

from broker.addresses import Address
from broker.delivery import IDeliveryQueue
from broker.envelope import Tier, now_ms
from broker.history import agent_mail, entry_bytes
from broker.limits import DEFAULT_HISTORY_RETENTION_MS
from broker.ports import HistoryQuery, IOperatorView
from broker.relay import Relay
from broker.testing.base import WAIT_BOUND
from broker.testing.polling import eventually

Body = TypeVar("Body")


class OperatorViewConformance(ABC, Generic[Body]):
    @abstractmethod
    def make_view(self) -> AbstractAsyncContextManager[tuple[Relay[Body], IOperatorView]]:
        """A started relay on a fresh, empty store, and an opened view of that store."""

    def make_view_and_queue(
        self,
    ) -> AbstractAsyncContextManager[tuple[Relay[Body], IOperatorView, IDeliveryQueue]]:
        """A started relay, an opened view and an opened delivery queue of one fresh store."""
        pytest.skip(f"{type(self).__name__} wires no delivery queue (make_view_and_queue)")

    def make_history_view(
        self,
        retention_ms: int = DEFAULT_HISTORY_RETENTION_MS,
        clock: Callable[[], int] = now_ms,
        max_bytes: int = 0,
    ) -> AbstractAsyncContextManager[tuple[Relay[Body], IOperatorView, IDeliveryQueue]]:
        """As ``make_view_and_queue``, the stores keeping ``retention_ms`` of history (at most
        ``max_bytes`` per agent; 0 = no cap), expiry by ``clock``."""
        pytest.skip(f"{type(self).__name__} wires no history settings (make_history_view)")

    @abstractmethod
    def body(self, n: int) -> Body: ...

    def words(self, n: int, text: str) -> Body:
        """A valid body with ``text`` as its text (for the history's word match); defaults to ``body``."""
        return self.body(n)

    @abstractmethod
    def reply(self, n: int, envelope_id: str) -> Body:
        """A valid body answering ``envelope_id``."""

    @abstractmethod
    def address(self, tier: Tier, agent: str) -> Address: ...

    async def _agents(self, relay: Relay[Body], *names: str) -> None:
        for name in names:
            await relay.register(name, self.address(Tier.HOST, name), f"s-{name}")

    async def test_agents_counts_backlog_pending_and_pages(self) -> None:
        async with self.make_view() as (relay, view):
            await self._agents(relay, "carol", "alice", "bob")
            first = await relay.send("alice", "bob", self.body(1))
            for n in (2, 3):
                await relay.send("alice", "bob", self.body(n))
            await relay.fetch("bob", 1)
            page = await view.agents()
            assert [a.agent for a in page.agents] == ["alice", "bob", "carol"]
            assert page.total == 3
            bob = page.agents[1]
            assert (bob.inbox_depth, bob.pending, bob.dead_letters) == (3, 1, 0)
            assert bob.provider == "claudecode" and bob.tier is Tier.HOST and bob.session == "s-bob"
            assert bob.oldest_unacked_ms is not None
            assert abs(bob.oldest_unacked_ms - int(first.sent_at.timestamp() * 1000)) < 60_000
            alice = page.agents[0]
            assert (alice.inbox_depth, alice.pending, alice.oldest_unacked_ms) == (0, 0, None)
            later = await view.agents(limit=1, after="alice")
            assert [a.agent for a in later.agents] == ["bob"] and later.total == 3

    async def test_last_seen_moves_on_register_fetch_and_ack(self) -> None:
        async with self.make_view() as (relay, view):
            await self._agents(relay, "alice", "bob")
            seen = {a.agent: a.last_seen_ms for a in (await view.agents()).agents}
            assert seen["alice"] is not None and seen["bob"] is not None
            sent = await relay.send("alice", "bob", self.body(1))
            await relay.fetch("bob", 4)
            await relay.ack("bob", [sent.id])
            after = {a.agent: a.last_seen_ms for a in (await view.agents()).agents}
            assert (after["bob"] or 0) >= seen["bob"]
            registration = await relay.registration("bob")
            assert registration is not None and registration.last_seen is not None
            listed = await relay.registrations(after="alice")
            assert [r.agent for r in listed] == ["bob"] and listed[0].last_seen is not None

    async def test_unacknowledged_is_read_only_and_oldest_first(self) -> None:
        async with self.make_view() as (relay, view):
            await self._agents(relay, "alice", "bob")
            ids = [(await relay.send("alice", "bob", self.body(n))).id for n in range(4)]
            await relay.fetch("bob", 1)
            for _ in range(2):
                peeked = await view.unacknowledged("bob")
                assert [e.envelope_id for e in peeked] == ids
                assert [e.deliveries for e in peeked] == [1, 0, 0, 0]
                assert not any(e.first_delivery for e in peeked)
                assert peeked[1].sender == "alice" and peeked[1].to == "bob"
            assert [e.envelope_id for e in await view.unacknowledged("bob", 2, after=ids[0])] == ids[1:3]
            fetched = await relay.fetch("bob", 8)
            assert [e.deliveries for e in fetched] == [2, 1, 1, 1]  # peeking counted nothing
            assert await view.unacknowledged("nobody") == []

    async def test_thread_follows_in_reply_to_both_ways(self) -> None:
        async with self.make_view() as (relay, view):
            await self._agents(relay, "alice", "bob")
            ask = (await relay.send("alice", "bob", self.body(1))).id
            answer = (await relay.send("bob", "alice", self.reply(2, ask))).id
            again = (await relay.send("alice", "bob", self.reply(3, answer))).id
            aside = (await relay.send("bob", "alice", self.reply(4, ask))).id
            await relay.send("alice", "bob", self.body(5))
            parents = {answer: ask, again: answer, aside: ask}
            for start in (ask, answer, again, aside):
                shown = [e.envelope_id for e in await view.thread(start)]
                assert sorted(shown) == sorted([ask, *parents]) and shown[0] == ask
                assert all(shown.index(parents[e]) < shown.index(e) for e in parents)
            assert len(await view.thread(ask, limit=2)) == 2
            assert await view.thread("env_00000000000000000000000000") == []

    async def test_a_requeued_dead_letter_keeps_its_thread(self) -> None:
        async with self.make_view_and_queue() as (relay, view, queue):
            await self._agents(relay, "alice", "bob")
            ask = (await relay.send("alice", "bob", self.body(1))).id
            answer = (await relay.send("bob", "alice", self.reply(2, ask))).id
            now = ask
            for _ in range(2):  # dead-lettered and requeued twice: a new id each time
                (claimed,) = await queue.claim("bob", "bob@loop", 1, visibility=30.0)
                assert claimed.envelope_id == now
                assert await queue.dead_letter("bob", now, "RuntimeError: boom", consumer="bob@loop")
                (now,) = await queue.requeue("bob")
            follow_up = (await relay.send("alice", "bob", self.reply(3, ask))).id
            thread = {ask: [now, answer, follow_up]}
            for start in (ask, now, answer, follow_up):
                shown = [e.envelope_id for e in await view.thread(start)]
                assert sorted(shown) == sorted(thread[ask]), start
            (requeued,) = [e for e in await view.unacknowledged("bob") if e.envelope_id == now]
            assert requeued.requeued_from[-1] == ask and len(requeued.requeued_from) == 2

    async def test_follow_sees_new_envelopes_and_counts_nothing(self) -> None:
        async with self.make_view() as (relay, view):
            await self._agents(relay, "alice", "bob", "carol")
            await relay.send("alice", "bob", self.body(0))  # before following: not shown
            stream = view.follow("bob")
            first = asyncio.ensure_future(anext(stream))
            sent: list[str] = []

            async def sent_and_seen() -> bool:
                await relay.send("alice", "carol", self.body(1))
                sent.append((await relay.send("alice", "bob", self.body(2))).id)
                await asyncio.sleep(0)
                return first.done()

            try:
                await eventually(sent_and_seen, WAIT_BOUND, "a followed envelope", interval=0.05)
                got = first.result()
            finally:
                first.cancel()
                await stream.aclose()  # type: ignore[attr-defined]
            assert got.envelope_id in sent and got.to == "bob" and got.deliveries == 0
            assert all(e.deliveries == 0 for e in await view.unacknowledged("bob"))

    async def test_history_keeps_what_was_acknowledged_read_only(self) -> None:
        async with self.make_history_view() as (relay, view, _):
            await self._agents(relay, "alice", "bob", "carol")
            ids = [(await relay.send("alice", "bob", self.body(n))).id for n in range(3)]
            other = (await relay.send("carol", "alice", self.body(9))).id
            await relay.fetch("bob", 8)
            await relay.fetch("bob", 8)  # handed out twice before the acknowledgement
            await relay.ack("bob", ids[:2])
            page = await view.history("bob")
            assert [a.envelope.envelope_id for a in page.entries] == ids[:2] and page.next is None
            first = page.entries[0]
            assert (first.outcome, first.reason, first.envelope.deliveries) == ("acknowledged", None, 2)
            assert first.envelope.sender == "alice" and first.envelope.to == "bob"
            assert first.archived_at_ms >= first.envelope.sent_at_ms - 60_000
            assert [e.envelope_id for e in await view.unacknowledged("bob")] == ids[2:]
            # only the agent's own history: alice's (mail to alice still queued) and carol's are empty
            assert (await view.history("alice")).entries == [] and (await view.history("carol")).read == 0
            assert other not in [a.envelope.envelope_id for a in (await view.history("bob")).entries]
            await relay.ack("bob", ids[:2])  # acknowledging again keeps one copy
            assert len((await view.history("bob")).entries) == 2
            assert (await view.history("nobody")).entries == []

    async def test_history_keeps_dead_lettered_and_expired_envelopes_with_their_outcome(self) -> None:
        offset = [0]
        async with self.make_history_view(clock=lambda: now_ms() + offset[0]) as (relay, view, queue):
            await self._agents(relay, "alice", "bob")
            doomed = (await relay.send("alice", "bob", self.body(1))).id
            (claimed,) = await queue.claim("bob", "bob@loop", 1, visibility=30.0)
            assert await queue.dead_letter(
                "bob", claimed.envelope_id, "RuntimeError: boom", consumer="bob@loop"
            )
            late = (await relay.send("alice", "bob", self.body(2), ttl_ms=1000)).id
            swept = (await relay.send("alice", "bob", self.body(3), ttl_ms=1000)).id
            offset[0] = 5000
            await relay.fetch("bob", 1)  # the oldest expired one goes at fetch; the sweep takes the rest
            await relay.sweep()
            page = await view.history("bob")
            outcomes = {a.envelope.envelope_id: (a.outcome, a.reason) for a in page.entries}
            assert outcomes == {
                doomed: ("dead_lettered", "RuntimeError: boom"),
                late: ("expired", None),
                swept: ("expired", None),
            }

    async def test_history_query_filters_by_sender_kind_words_and_time_and_pages(self) -> None:
        async with self.make_history_view() as (relay, view, _):
            await self._agents(relay, "alice", "bob", "carol")
            texts = ["Deploy the API today", "lunch?", "the api DEPLOY failed", "deploy-api notes"]
            sent = [(await relay.send("alice", "bob", self.words(n, t))).id for n, t in enumerate(texts)]
            from_carol = (await relay.send("carol", "bob", self.words(9, "deploy api too"))).id
            await relay.fetch("bob", 8)
            await relay.ack("bob", [*sent, from_carol])
            found = await view.history("bob", HistoryQuery(words=("deploy", "API")))
            assert [a.envelope.envelope_id for a in found.entries] == [sent[0], sent[2], sent[3], from_carol]
            mine = await view.history("bob", HistoryQuery(sender="alice", words=("deploy",)))
            assert [a.envelope.envelope_id for a in mine.entries] == [sent[0], sent[2], sent[3]]
            assert (await view.history("bob", HistoryQuery(words=("deplo",)))).entries == []
            everything = (await view.history("bob")).entries
            kind = everything[0].envelope.fields.get("kind")
            if kind is not None:
                assert len((await view.history("bob", HistoryQuery(kind=kind))).entries) == 5
                assert (await view.history("bob", HistoryQuery(kind="no-such-kind"))).entries == []
            at = [a.archived_at_ms for a in everything]
            assert (await view.history("bob", HistoryQuery(since_ms=at[-1] + 1))).entries == []
            assert (await view.history("bob", HistoryQuery(until_ms=at[0] - 1))).entries == []
            assert (
                len((await view.history("bob", HistoryQuery(since_ms=at[0], until_ms=at[-1]))).entries) == 5
            )
            # paged: two at a time, each page continuing after the last one's cursor
            seen: list[str] = []
            after: str | None = None
            for _ in range(5):
                page = await view.history("bob", limit=2, after=after)
                seen += [a.envelope.envelope_id for a in page.entries]
                assert page.read <= 3
                if page.next is None:
                    break
                after = page.next
            assert seen == [a.envelope.envelope_id for a in everything]
            with pytest.raises(ValueError, match="cursor"):
                await view.history("bob", after="1-2-3")

    async def test_history_retention_zero_keeps_nothing(self) -> None:
        async with self.make_history_view(retention_ms=0) as (relay, view, _):
            await self._agents(relay, "alice", "bob")
            sent = (await relay.send("alice", "bob", self.body(1))).id
            await relay.fetch("bob", 1)
            assert (await relay.ack("bob", [sent])).acknowledged == (sent,)
            assert (await view.history("bob")).entries == []
            assert await view.thread(sent) == []

    async def test_history_is_trimmed_by_time(self) -> None:
        async with self.make_history_view(retention_ms=200) as (relay, view, _):
            await self._agents(relay, "alice", "bob")
            first = (await relay.send("alice", "bob", self.body(0))).id
            await relay.fetch("bob", 1)
            await relay.ack("bob", [first])
            n = [0]

            async def trimmed() -> bool:
                n[0] += 1
                sent = (await relay.send("alice", "bob", self.body(n[0]))).id
                await relay.fetch("bob", 1)
                await relay.ack("bob", [sent])
                kept = [a.envelope.envelope_id for a in (await view.history("bob")).entries]
                assert sent in kept
                return first not in kept

            await eventually(trimmed, WAIT_BOUND, "the oldest history entry trimmed", interval=0.05)

    async def test_a_thread_stays_whole_after_acknowledgement(self) -> None:
        async with self.make_history_view() as (relay, view, _):
            await self._agents(relay, "alice", "bob")
            ask = (await relay.send("alice", "bob", self.body(1))).id
            await relay.fetch("bob", 1)
            answer = (await relay.send("bob", "alice", self.reply(2, ask))).id
            await relay.ack("bob", [ask])
            await relay.fetch("alice", 1)
            await relay.ack("alice", [answer])
            for start in (ask, answer):
                assert [e.envelope_id for e in await view.thread(start)] == [ask, answer]

    async def test_agent_mail_is_what_the_agent_sent_or_received_and_nothing_else(self) -> None:
        async with self.make_history_view() as (relay, view, _):
            await self._agents(relay, "alice", "bob", "carol")
            ask = (await relay.send("alice", "bob", self.words(1, "deploy the api"))).id
            aside = (await relay.send("carol", "bob", self.words(2, "deploy the api too"))).id
            await relay.fetch("bob", 8)
            await relay.ack("bob", [ask, aside])
            answer = (await relay.send("bob", "alice", self.reply(3, ask))).id
            await relay.fetch("alice", 8)
            await relay.ack("alice", [answer])
            everyone = ["alice", "bob", "carol"]
            mail = await agent_mail(view, "alice", everyone, HistoryQuery(), 10)
            order = [e.envelope.envelope_id for e in mail.entries]  # by time left; a tie by holder
            assert sorted(order) == sorted([ask, answer]) and mail.next is None
            words = await agent_mail(view, "alice", everyone, HistoryQuery(words=("deploy",)), 10)
            assert [e.envelope.envelope_id for e in words.entries] == [ask]
            carol = await agent_mail(view, "carol", everyone, HistoryQuery(words=("deploy",)), 10)
            assert [e.envelope.envelope_id for e in carol.entries] == [aside]
            with_bob = await agent_mail(view, "alice", ["bob"], HistoryQuery(sender="bob"), 10)
            assert [e.envelope.envelope_id for e in with_bob.entries] == order
            first = await agent_mail(view, "alice", everyone, HistoryQuery(), 1)
            assert [e.envelope.envelope_id for e in first.entries] == order[:1] and first.next is not None
            rest = await agent_mail(view, "alice", everyone, HistoryQuery(), 1, first.next)
            assert [e.envelope.envelope_id for e in rest.entries] == order[1:]
            with pytest.raises(ValueError, match="cursor"):
                await agent_mail(view, "alice", everyone, HistoryQuery(), 1, "1-0")

    async def test_history_keeps_at_most_its_byte_cap_newest_first(self) -> None:
        cap = 2000
        async with self.make_history_view(max_bytes=cap) as (relay, view, _):
            await self._agents(relay, "alice", "bob")
            sent = []
            for n in range(8):
                sent.append((await relay.send("alice", "bob", self.words(n, f"{n} " + "x" * 500))).id)
                await relay.fetch("bob", 1)
                await relay.ack("bob", [sent[-1]])
            kept = (await view.history("bob")).entries
            ids = [a.envelope.envelope_id for a in kept]
            assert ids == sent[-len(ids) :] and 2 <= len(ids) < 8  # the newest, oldest gone first
            assert sum(entry_bytes(a) for a in kept) <= cap < sum(entry_bytes(a) for a in kept) + 600
            big = (await relay.send("alice", "bob", self.words(9, "y" * 3000))).id
            await relay.fetch("bob", 1)
            await relay.ack("bob", [big])
            assert [a.envelope.envelope_id for a in (await view.history("bob")).entries] == [big]
