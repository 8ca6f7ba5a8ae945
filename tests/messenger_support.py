"""Messengers wired the way production wires them, on memory or on the test Redis server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

from prometheus_client import CollectorRegistry

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from broker.addresses import WorkbenchAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
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


ONCE = DeliverySettings(max_attempts=1, visibility=30.0, poll=0.2)
"""Fail once, and the envelope is a dead letter."""


def dead_letters_for(url: str, prefix: str, texts: list[str]) -> list[str]:
    """Send ``texts`` from alice to builder and fail each once: they become dead letters."""

    async def run() -> list[str]:
        async with redis_messengers(AgentMessageContract(), url, 1, ONCE, prefix=prefix) as (messenger,):
            for agent in ("alice", "builder"):
                await messenger.register(agent, WorkbenchAddress.parse(f"s-{agent}"), f"s-{agent}")
            sent = [
                (await messenger.send("alice", "builder", AgentMessage(kind=Kind.KIND_REQUEST, text=t))).id
                for t in texts
            ]
            async with messenger.receive("builder", wait=5.0) as deliveries:
                for _ in sent:
                    delivery = await asyncio.wait_for(anext(deliveries), 5.0)
                    assert (
                        await delivery.fail("ConnectionError: session queue unavailable") == "dead_lettered"
                    )
            return sent

    return asyncio.run(run())
