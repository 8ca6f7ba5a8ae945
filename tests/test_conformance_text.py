"""The conformance suite with a second body type on both backends: the relay is generic."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest

from broker.addresses import Address
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.base import Limits
from broker.testing.conformance import RelayConformance
from tests.support import Text, TextContract, address_for, memory_relays, redis_relays


class TestMemoryTextRelay(RelayConformance[Text]):
    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[Text]]]:
        return memory_relays(TextContract(), count, limits)

    def body(self, n: int) -> Text:
        return Text(f"text {n}")

    def invalid_body(self) -> Text:
        return Text("")

    def address(self, tier: Tier, agent: str) -> Address:
        return address_for(tier, agent)


class TestRedisTextRelay(TestMemoryTextRelay):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url

    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[Text]]]:
        return redis_relays(TextContract(), self.url, count, limits)
