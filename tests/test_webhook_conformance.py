"""The webhook state conformance suite (``broker.testing.webhook_conformance``) on both backends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.memory import MemoryInboxStore, MemoryRegistry
from adapters.memory.notice import MemoryNoticeStore
from adapters.memory.state import MemoryState
from adapters.memory.webhooks import MemoryWebhooks
from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from adapters.redis.webhooks import RedisWebhooks
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.ports import INoticeStore
from broker.relay import Relay
from broker.testing.webhook_conformance import WebhookConformance, WebhookState
from tests.support import unique_prefix


class TestMemoryWebhooks(WebhookConformance):
    @contextlib.asynccontextmanager
    async def make_store(self) -> AsyncIterator[tuple[Relay[Any], WebhookState, INoticeStore]]:
        state = MemoryState()
        notices = MemoryNoticeStore(state)
        inbox, registry = MemoryInboxStore(state), MemoryRegistry(state)
        async with Relay(AgentMessageContract(), inbox, registry, notices=notices) as relay:
            yield relay, MemoryWebhooks(state), notices

    def body(self, n: int) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_NOTE, text=f"message {n}")


class TestRedisWebhooks(TestMemoryWebhooks):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    @contextlib.asynccontextmanager
    async def make_store(self) -> AsyncIterator[tuple[Relay[Any], WebhookState, INoticeStore]]:
        connection = RedisConnection(RedisSettings(url=self.url, prefix=unique_prefix()))
        notices = RedisNoticeStore(connection)
        inbox, registry = RedisInboxStore(connection), RedisRegistry(connection)
        async with Relay(AgentMessageContract(), inbox, registry, notices=notices) as relay:
            yield relay, RedisWebhooks(connection), notices


class TestRedisClusterWebhooks(TestRedisWebhooks):
    """The same suite on a real 3-master Redis Cluster: each webhook script runs on the agent's slot."""

    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url
