"""``IOperatorView`` (the operator queries of the shell and the dashboard) on both backends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.memory.operator_view import MemoryOperatorView
from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.operator_view import RedisOperatorView
from broker.addresses import Address
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.delivery import IDeliveryQueue
from broker.envelope import Tier, now_ms
from broker.limits import DEFAULT_HISTORY_RETENTION_MS
from broker.ports import IOperatorView
from broker.relay import Relay
from broker.testing.operator_conformance import OperatorViewConformance
from tests.support import address_for, unique_prefix


class TestMemoryOperatorView(OperatorViewConformance[AgentMessage]):
    @contextlib.asynccontextmanager
    async def make_view(self) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView]]:
        state = MemoryState()
        async with Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state)) as relay:
            yield relay, MemoryOperatorView(state)

    @contextlib.asynccontextmanager
    async def make_view_and_queue(
        self,
    ) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView, IDeliveryQueue]]:
        state = MemoryState()
        async with Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state)) as relay:
            yield relay, MemoryOperatorView(state), MemoryDeliveryQueue(state)

    @contextlib.asynccontextmanager
    async def make_history_view(
        self,
        retention_ms: int = DEFAULT_HISTORY_RETENTION_MS,
        clock: Callable[[], int] = now_ms,
        max_bytes: int = 0,
    ) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView, IDeliveryQueue]]:
        state = MemoryState(history_retention_ms=retention_ms, clock=clock, history_max_bytes=max_bytes)
        async with Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state)) as relay:
            yield relay, MemoryOperatorView(state), MemoryDeliveryQueue(state)

    def body(self, n: int) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_NOTE, text=f"message {n}")

    def words(self, n: int, text: str) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_NOTE, text=text)

    def reply(self, n: int, envelope_id: str) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_REPLY, text=f"answer {n}", in_reply_to=envelope_id)

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisOperatorView(TestMemoryOperatorView):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    @contextlib.asynccontextmanager
    async def make_view(self) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView]]:
        settings = RedisSettings(url=self.url, prefix=unique_prefix())
        connection = RedisConnection(settings)
        relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
        view = RedisOperatorView(RedisConnection(settings))
        async with relay:
            await view.open()
            try:
                yield relay, view
            finally:
                await view.close()

    @contextlib.asynccontextmanager
    async def make_history_view(
        self,
        retention_ms: int = DEFAULT_HISTORY_RETENTION_MS,
        clock: Callable[[], int] = now_ms,
        max_bytes: int = 0,
    ) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView, IDeliveryQueue]]:
        settings = RedisSettings(
            url=self.url,
            prefix=unique_prefix(),
            history_retention_ms=retention_ms,
            history_max_bytes=max_bytes,
        )
        connection = RedisConnection(settings)
        relay = Relay(
            AgentMessageContract(), RedisInboxStore(connection, clock=clock), RedisRegistry(connection)
        )
        view = RedisOperatorView(RedisConnection(settings))
        queue = RedisDeliveryQueue(connection)
        async with relay:
            await view.open()
            await queue.open()
            try:
                yield relay, view, queue
            finally:
                await queue.close()
                await view.close()

    @contextlib.asynccontextmanager
    async def make_view_and_queue(
        self,
    ) -> AsyncIterator[tuple[Relay[AgentMessage], IOperatorView, IDeliveryQueue]]:
        async with self.make_view() as (relay, view):
            connection = view.connection  # type: ignore[attr-defined]
            queue = RedisDeliveryQueue(connection)
            await queue.open()
            try:
                yield relay, view, queue
            finally:
                await queue.close()


class TestRedisClusterOperatorView(TestRedisOperatorView):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url
