"""Messengers wired the way production wires them, on memory or on the test Redis server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

from prometheus_client import CollectorRegistry

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from broker.contract import Contract
from broker.delivery import DeliverySettings
from broker.messenger import Messenger
from broker.relay import Relay
from tests.support import unique_prefix

B = TypeVar("B")


@contextlib.asynccontextmanager
async def memory_messengers(
    contract: Contract[B], count: int, settings: DeliverySettings
) -> AsyncIterator[list[Messenger[B]]]:
    """``count`` messengers, each on its own relay, sharing one memory state (and, as processes on one
    Redis share its pending list, one delivery queue)."""
    state = MemoryState()
    queue = MemoryDeliveryQueue(state)
    async with contextlib.AsyncExitStack() as stack:
        messengers = []
        for _ in range(count):
            relay = Relay(
                contract, MemoryInboxStore(state), MemoryRegistry(state), metrics=CollectorRegistry()
            )
            await stack.enter_async_context(relay)
            messengers.append(await stack.enter_async_context(Messenger(relay, queue, settings)))
        yield messengers


@contextlib.asynccontextmanager
async def redis_messengers(
    contract: Contract[B], url: str, count: int, settings: DeliverySettings, *, prefix: str | None = None
) -> AsyncIterator[list[Messenger[B]]]:
    """``count`` messengers, each with its own connection and relay, on one Redis key prefix."""
    redis_settings = RedisSettings(url=url, prefix=prefix or unique_prefix())
    async with contextlib.AsyncExitStack() as stack:
        messengers = []
        for _ in range(count):
            connection = RedisConnection(redis_settings)
            relay = Relay(contract, RedisInboxStore(connection), RedisRegistry(connection))
            await stack.enter_async_context(relay)
            queue = RedisDeliveryQueue(connection)
            messengers.append(await stack.enter_async_context(Messenger(relay, queue, settings)))
        yield messengers
