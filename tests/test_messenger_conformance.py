"""The messenger's conformance suite on both backends, with a second body type (it is generic)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import pytest

from broker.addresses import Address
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.delivery import DeliverySettings
from broker.envelope import Tier
from broker.messenger import Messenger
from broker.testing.messenger_conformance import MessengerConformance
from relay.workbench import messenger_on
from tests.messenger_support import memory_messengers, redis_messengers
from tests.support import Text, TextContract, address_for, unique_prefix


class TestMemoryMessenger(MessengerConformance[Text]):
    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[Text]]]:
        return memory_messengers(TextContract(), count, settings)

    def body(self, n: int) -> Text:
        return Text(f"text {n}")

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisMessenger(TestMemoryMessenger):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[Text]]]:
        return redis_messengers(TextContract(), self.url, count, settings)


class TestMemoryAgentMessageMessenger(MessengerConformance[AgentMessage]):
    """The relay's real contract, as the Workbench sessions use it."""

    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[AgentMessage]]]:
        return memory_messengers(AgentMessageContract(), count, settings)

    def body(self, n: int) -> AgentMessage:
        return AgentMessage(kind=Kind.KIND_REQUEST, text=f"request {n}", reference=f"ref-{n}")

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisAgentMessageMessenger(TestMemoryAgentMessageMessenger):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[AgentMessage]]]:
        return redis_messengers(AgentMessageContract(), self.url, count, settings)


class TestWorkbenchHostMessenger(TestMemoryAgentMessageMessenger):
    """The messengers exactly as ``relay workbench`` wires them (``relay.workbench.messenger_on``)."""

    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    @contextlib.asynccontextmanager
    async def make_messengers(  # type: ignore[override]
        self, count: int, settings: DeliverySettings
    ) -> AsyncIterator[list[Messenger[AgentMessage]]]:
        prefix = unique_prefix()
        async with contextlib.AsyncExitStack() as stack:
            made = [
                await stack.enter_async_context(messenger_on(self.url, settings, prefix=prefix))
                for _ in range(count)
            ]
            yield made


class TestRedisClusterMessenger(TestMemoryMessenger):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url

    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[Text]]]:
        return redis_messengers(TextContract(), self.url, count, settings)


class TestRedisClusterAgentMessageMessenger(TestMemoryAgentMessageMessenger):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url

    def make_messengers(
        self, count: int, settings: DeliverySettings
    ) -> AbstractAsyncContextManager[list[Messenger[AgentMessage]]]:
        return redis_messengers(AgentMessageContract(), self.url, count, settings)
