"""The conformance suite for relay's own instantiation, ``Relay[AgentMessage]``, on both backends."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest

from broker.addresses import Address
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.base import Limits
from broker.testing.conformance import RelayConformance
from broker.testing.notice_conformance import NoticeConformance
from tests.support import address_for, memory_relays, redis_relays


class TestMemoryRelay(RelayConformance[AgentMessage]):
    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[AgentMessage]]]:
        return memory_relays(AgentMessageContract(), count, limits)

    def body(self, n: int) -> AgentMessage:
        kinds = [Kind.KIND_NOTE, Kind.KIND_REQUEST, Kind.KIND_STATUS]
        if n % 4 == 3:
            return AgentMessage(kind=Kind.KIND_NOTE, text=f"note {n} ✓", reference=f"ref/{n}")
        return AgentMessage(kind=kinds[n % 3], text=f"message {n}")

    def invalid_body(self) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_REPLY, text="")

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisRelay(TestMemoryRelay):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[AgentMessage]]]:
        return redis_relays(AgentMessageContract(), self.url, count, limits)


class TestRedisClusterRelay(TestMemoryRelay):
    """The same suite on a real 3-master Redis Cluster: every script runs on one node."""

    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url

    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[AgentMessage]]]:
        return redis_relays(AgentMessageContract(), self.url, count, limits)


class TestMemoryNotices(NoticeConformance[AgentMessage]):
    make_relays = TestMemoryRelay.make_relays
    body = TestMemoryRelay.body
    invalid_body = TestMemoryRelay.invalid_body
    address = TestMemoryRelay.address


class TestRedisNotices(TestMemoryNotices):
    _url = TestRedisRelay._url
    make_relays = TestRedisRelay.make_relays


class TestRedisClusterNotices(TestMemoryNotices):
    _url = TestRedisClusterRelay._url
    make_relays = TestRedisClusterRelay.make_relays
