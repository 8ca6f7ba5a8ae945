"""Conformance of contact policies (``broker.ports.IPolicyStore``) and of the send check the inbox store
makes with them (``IInboxStore.append``): accepted, refused, changed while sends run, people, unknown
senders.

Subclass ``PolicyConformance`` with the ``ConformanceBase`` hooks and ``make_policed``: relays and a
policy store on one fresh backend (like workers and ``relay policy set`` on one Redis).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import pytest

from broker.addresses import HUMAN_SESSION, HumanAddress
from broker.envelope import Tier
from broker.errors import NotAccepted, RateLimited, UnknownRecipient, UnregisteredAgent
from broker.limits import MAX_POLICY_AGENTS
from broker.policy import DEFAULT_POLICY, LIST, OPEN, REGISTERED, ContactPolicy, PolicySummary, listing
from broker.ports import IPolicyStore
from broker.relay import Relay
from broker.testing.base import WAIT_BOUND, ConformanceBase, Limits

Body = TypeVar("Body")

SENDS_PER_LOOP = 60
"""Sends each loop of ``test_a_policy_changed_while_sends_run_judges_each_send_once`` makes at most."""


class PolicyConformance(ConformanceBase[Body]):
    @abstractmethod
    def make_policed(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[tuple[list[Relay[Body]], IPolicyStore]]:
        """``count`` started relays and an open policy store, all on one fresh, empty backend."""

    async def _person(self, relay: Relay[Body], agent: str) -> None:
        await relay.register(agent, HumanAddress.parse("shell"), HUMAN_SESSION)

    @staticmethod
    def _refused(relay: Relay[Body], tier: Tier = Tier.HOST) -> float:
        value = relay.metrics.registry.get_sample_value(
            "csf_relay_sends_not_accepted_total", {"tier": tier.label}
        )
        return value or 0.0

    async def test_an_agent_without_a_policy_is_open(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            assert await policies.get("bob") == DEFAULT_POLICY
            assert (await policies.get("bob")).accept_from == OPEN
            await relay.send("alice", "bob", self.body(0))
            assert len(await relay.fetch("bob", 16)) == 1

    async def test_a_list_accepts_the_ids_it_names_and_refuses_the_others(self) -> None:
        async with self.make_policed(2) as ((one, two), policies):
            await self._agents(one, "alice", "bob", "carol")
            assert await policies.set("bob", listing(["alice"])) == DEFAULT_POLICY
            accepted = await two.send("alice", "bob", self.body(1))
            with pytest.raises(NotAccepted) as refused:
                await one.send("carol", "bob", self.body(2))
            assert refused.value.code == "not_accepted" and not refused.value.retryable
            assert refused.value.details() == {"agent": "bob", "field": "to", "accept_from": LIST}
            assert "relay policy set bob" in refused.value.message
            assert [e.id for e in await one.fetch("bob", 16)] == [accepted.id]  # nothing of carol's
            assert self._refused(one) == 1 and self._refused(two) == 0  # counted by the relay refusing

    async def test_a_refused_send_changes_nothing_and_spends_no_rate_token(self) -> None:
        async with self.make_policed(1, Limits(send_rate=0.01, send_burst=1)) as ((relay,), policies):
            await self._agents(relay, "alice", "bob", "carol")
            await policies.set("bob", listing(["carol"]))
            for _ in range(3):
                with pytest.raises(NotAccepted):
                    await relay.send("alice", "bob", self.body(3), idempotency_key="k-1")
            assert await relay.fetch("bob", 16) == []
            sent = await relay.send("alice", "carol", self.body(4))  # the one token is still there
            with pytest.raises(RateLimited):
                await relay.send("alice", "carol", self.body(5))
            assert [e.id for e in await relay.fetch("carol", 16)] == [sent.id]

    async def test_a_refused_send_does_not_use_its_idempotency_key_up(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            await policies.set("bob", listing(["carol"]))
            with pytest.raises(NotAccepted):
                await relay.send("alice", "bob", self.body(6), idempotency_key="k-2")
            await policies.set("bob", listing(["alice", "carol"]))
            first = await relay.send("alice", "bob", self.body(6), idempotency_key="k-2")
            assert [e.id for e in await relay.fetch("bob", 16)] == [first.id]

    async def test_a_repeat_of_an_accepted_send_is_answered_whatever_the_policy_now(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            first = await relay.send("alice", "bob", self.body(7), idempotency_key="k-3")
            await policies.set("bob", listing(["carol"]))
            again = await relay.send("alice", "bob", self.body(7), idempotency_key="k-3")
            assert again.id == first.id
            with pytest.raises(NotAccepted):
                await relay.send("alice", "bob", self.body(8), idempotency_key="k-4")

    async def test_set_replaces_the_whole_policy_and_answers_the_old_one(self) -> None:
        async with self.make_policed(2) as ((relay, _), policies):
            await self._agents(relay, "alice", "bob")
            wide = listing(["alice", "carol", "dave"])
            assert await policies.set("bob", wide) == DEFAULT_POLICY
            assert await policies.get("bob") == wide
            assert await policies.set("bob", listing(["carol"])) == wide
            assert await policies.get("bob") == listing(["carol"])  # alice and dave are gone
            with pytest.raises(NotAccepted):
                await relay.send("alice", "bob", self.body(9))
            assert await policies.set("bob", ContactPolicy(REGISTERED)) == listing(["carol"])
            await relay.send("alice", "bob", self.body(10))
            assert await policies.set("bob", DEFAULT_POLICY) == ContactPolicy(REGISTERED)
            assert await policies.get("bob") == DEFAULT_POLICY
            assert await policies.get("alice") == DEFAULT_POLICY  # one agent's policy is its own

    async def test_registered_accepts_agents_and_people(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            await self._person(relay, "ada")
            await policies.set("bob", ContactPolicy(REGISTERED))
            await relay.send("alice", "bob", self.body(11))
            await relay.send("ada", "bob", self.body(12), session=HUMAN_SESSION)
            assert sorted(e.sender for e in await relay.fetch("bob", 16)) == ["ada", "alice"]

    async def test_people_are_refused_only_by_a_list_that_does_not_name_them(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            await self._person(relay, "ada")
            await relay.send("ada", "bob", self.body(13))  # open
            await policies.set("bob", listing(["alice"]))
            with pytest.raises(NotAccepted):
                await relay.send("ada", "bob", self.body(14))
            await policies.set("bob", listing(["alice", "ada"]))
            await relay.send("ada", "bob", self.body(15))
            assert [e.sender for e in await relay.fetch("bob", 16)] == ["ada", "ada"]

    async def test_unknown_senders_and_recipients_are_refused_as_before(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "bob")
            await policies.set("bob", listing(["ghost"]))  # a list may name an id not registered yet
            with pytest.raises(UnregisteredAgent):  # sending needs a registration first, whatever the list
                await relay.send("ghost", "bob", self.body(16))
            await policies.set("nobody", listing(["bob"]))  # and a policy may be set before registering
            with pytest.raises(UnknownRecipient):
                await relay.send("bob", "nobody", self.body(17))
            await self._agents(relay, "ghost", "nobody")
            await relay.send("ghost", "bob", self.body(18))
            await relay.send("bob", "nobody", self.body(19))
            with pytest.raises(NotAccepted):
                await relay.send("ghost", "nobody", self.body(20))
            assert self._refused(relay) == 1

    async def test_a_policy_outlives_a_new_registration(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            await policies.set("bob", listing(["carol"]))
            await relay.register("bob", self.address(Tier.HOST, "bob"), "s-bob-2")
            with pytest.raises(NotAccepted):
                await relay.send("alice", "bob", self.body(21))

    async def test_refusals_are_counted_by_the_send_tier(self) -> None:
        async with self.make_policed(1) as ((relay,), policies):
            await self._agents(relay, "alice", "bob")
            await self._agents(relay, "far", tier=Tier.NETWORK)
            await policies.set("bob", listing(["carol"]))
            for sender in ("alice", "far", "far"):
                with pytest.raises(NotAccepted):
                    await relay.send(sender, "bob", self.body(22))
            assert self._refused(relay, Tier.HOST) == 1 and self._refused(relay, Tier.NETWORK) == 2

    async def test_a_policy_changed_while_sends_run_judges_each_send_once(self) -> None:
        async with self.make_policed(2) as ((one, two), policies):
            await self._agents(one, "alice", "bob")
            changed = asyncio.Event()
            landed: list[str] = []
            after: list[str | None] = []

            async def sender(relay: Relay[Body]) -> None:
                """Send until 5 sends began after the policy changed (bounded: ``SENDS_PER_LOOP``)."""
                for i in range(SENDS_PER_LOOP):
                    began_after = changed.is_set()
                    try:
                        sent: str | None = (await relay.send("alice", "bob", self.body(i))).id
                    except NotAccepted:
                        sent = None
                    if sent is not None:
                        landed.append(sent)
                    if began_after:
                        after.append(sent)
                        if len(after) >= 10:
                            return
                    await asyncio.sleep(0)  # a turn for the others (a memory send never yields)

            loops = asyncio.gather(*(sender(relay) for relay in (one, two, one, two)))
            for _ in range(SENDS_PER_LOOP):  # let some sends land first
                if len(landed) >= 20:
                    break
                await asyncio.sleep(0)  # yields to the senders; not a timing wait
            await policies.set("bob", listing(["carol"]))  # lands among the sends in flight
            changed.set()
            await asyncio.wait_for(loops, WAIT_BOUND * 4)
            stored = await one.fetch("bob", 256)
            assert sorted(e.id for e in stored) == sorted(landed)  # each send either stored or refused
            assert landed and after and set(after) == {None}  # no send begun after set() got the old one
            refused = self._refused(one) + self._refused(two)
            assert refused >= len(after)

    async def test_summaries_name_the_kind_and_list_size_without_reading_lists(self) -> None:
        async with self.make_policed(1) as (_, policies):
            big = listing(f"agent-{i}" for i in range(MAX_POLICY_AGENTS))
            await policies.set("bob", big)
            await policies.set("carol", ContactPolicy(REGISTERED))
            assert await policies.get("bob") == big  # a list at the cap is kept whole
            assert await policies.summaries(["bob", "carol", "dave"]) == [
                PolicySummary(LIST, MAX_POLICY_AGENTS),
                PolicySummary(REGISTERED),
                PolicySummary(OPEN),
            ]
            assert await policies.summaries([]) == []
