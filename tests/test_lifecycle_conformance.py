"""Retiring agents and purging inboxes (``broker.testing.lifecycle_conformance``) on the memory
backend, one Redis and a 3-master cluster."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.memory.notice import MemoryNoticeStore
from adapters.memory.operator_view import MemoryOperatorView
from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.notice import RedisNoticeStore
from adapters.redis.operator_view import RedisOperatorView
from broker.addresses import Address
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.lifecycle_conformance import Lifecycle, LifecycleConformance
from tests.support import address_for, unique_prefix


class TestMemoryLifecycle(LifecycleConformance[AgentMessage]):
    @contextlib.asynccontextmanager
    async def make_lifecycle(self) -> AsyncIterator[Lifecycle[AgentMessage]]:
        state = MemoryState()
        inbox, registry = MemoryInboxStore(state), MemoryRegistry(state)
        relay = Relay(AgentMessageContract(), inbox, registry, notices=MemoryNoticeStore(state))
        async with relay:
            yield Lifecycle(relay, registry, inbox, MemoryOperatorView(state), MemoryDeliveryQueue(state))

    def body(self, n: int) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_NOTE, text=f"message {n}")

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisLifecycle(TestMemoryLifecycle):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    @contextlib.asynccontextmanager
    async def make_lifecycle(self) -> AsyncIterator[Lifecycle[AgentMessage]]:
        settings = RedisSettings(url=self.url, prefix=unique_prefix())
        connection = RedisConnection(settings)
        inbox, registry = RedisInboxStore(connection), RedisRegistry(connection)
        relay = Relay(AgentMessageContract(), inbox, registry, notices=RedisNoticeStore(connection))
        view = RedisOperatorView(RedisConnection(settings))
        queue = RedisDeliveryQueue(connection)
        async with relay:
            await view.open()
            await queue.open()
            try:
                yield Lifecycle(relay, registry, inbox, view, queue)
            finally:
                await queue.close()
                await view.close()


class TestRedisClusterLifecycle(TestRedisLifecycle):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url
