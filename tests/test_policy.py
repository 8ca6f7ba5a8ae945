"""Contact policies (docs/policy.md): the conformance suite (``broker.testing.policy_conformance``) on
memory, one Redis and a Redis Cluster, and the hostile lists ``broker.policy`` refuses before anything
is written."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from adapters.memory import MemoryPolicyStore
from adapters.redis import RedisConnection, RedisPolicyStore, RedisSettings
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.errors import InvalidArgument
from broker.limits import MAX_POLICY_AGENTS
from broker.policy import LIST, OPEN, REGISTERED, ContactPolicy, listing, parse_accept_from
from broker.ports import IPolicyStore
from broker.relay import Relay
from broker.testing.base import Limits
from broker.testing.policy_conformance import PolicyConformance
from tests.support import memory_relays, memory_state, redis_relays, unique_prefix
from tests.test_conformance import TestMemoryRelay

Policed = tuple[list[Relay[AgentMessage]], IPolicyStore]


class TestMemoryPolicies(PolicyConformance[AgentMessage]):
    body = TestMemoryRelay.body
    invalid_body = TestMemoryRelay.invalid_body
    address = TestMemoryRelay.address
    make_relays = TestMemoryRelay.make_relays

    @contextlib.asynccontextmanager
    async def make_policed(self, count: int, limits: Limits = Limits()) -> AsyncIterator[Policed]:
        state = memory_state(limits)
        async with memory_relays(AgentMessageContract(), count, limits, state=state) as relays:
            yield relays, MemoryPolicyStore(state)


class TestRedisPolicies(TestMemoryPolicies):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    @contextlib.asynccontextmanager
    async def make_policed(self, count: int, limits: Limits = Limits()) -> AsyncIterator[Policed]:
        prefix = unique_prefix()
        async with redis_relays(AgentMessageContract(), self.url, count, limits, prefix=prefix) as relays:
            store = RedisPolicyStore(RedisConnection(RedisSettings(url=self.url, prefix=prefix)))
            await store.open()
            try:
                yield relays, store
            finally:
                await store.close()


class TestRedisClusterPolicies(TestRedisPolicies):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url


def test_the_words_and_lists_of_accept_from() -> None:
    assert parse_accept_from("open") == ContactPolicy(OPEN)
    assert parse_accept_from("registered") == ContactPolicy(REGISTERED)
    assert parse_accept_from("alice, bob,alice") == ContactPolicy(LIST, frozenset({"alice", "bob"}))
    assert parse_accept_from("open,open") == ContactPolicy(LIST, frozenset({"open"}))  # an agent named open


def test_a_list_of_ten_thousand_ids_is_refused_naming_the_field_and_the_cap() -> None:
    ids = [f"agent-{i}" for i in range(10_000)]
    with pytest.raises(InvalidArgument) as refused:
        parse_accept_from(",".join(ids))
    violation = refused.value.violation
    assert (violation.field, violation.rule) == ("--accept-from", "accept_from.max_agents")
    assert f"at most {MAX_POLICY_AGENTS} agent ids" in violation.message
    with pytest.raises(InvalidArgument) as again:
        listing(ids)
    assert again.value.violation.rule == "accept_from.max_agents"
    assert listing(ids[:MAX_POLICY_AGENTS]).agents == frozenset(ids[:MAX_POLICY_AGENTS])  # the cap itself


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("alice,Bob", "--accept-from[1]"),
        ("alice,,bob", "--accept-from[1]"),
        ("alice,{bob}", "--accept-from[1]"),
        ("x" * 65, "--accept-from[0]"),
        ("", "--accept-from[0]"),
        ("alice,bob\n", "--accept-from[1]"),
    ],
)
def test_a_bad_id_is_refused_by_its_position(text: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_accept_from(text)
    assert refused.value.violation.field == field
    assert refused.value.violation.rule == "agent_id.pattern"
    assert "nothing was changed" in refused.value.violation.message
