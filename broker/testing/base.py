"""What the conformance suites share: the hooks a backend implements, the limits it is built with and
the helpers the tests use (``broker.testing.conformance`` documents how to run them)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

from broker.addresses import Address
from broker.envelope import Tier
from broker.relay import Relay
from broker.testing.polling import eventually

Body = TypeVar("Body")

WAIT_BOUND = 5.0
"""Seconds any single awaited step may take before a test fails."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits a backend is built with for the limit tests; the defaults mean none."""

    inbox_cap: int = 0
    send_rate: float = 0.0
    send_burst: int = 0
    max_waits_per_agent: int = 16
    max_waits: int = 10_000
    remind_after: float = 3600.0
    """Seconds before unacknowledged mail is announced again by a mail-pending wait."""
    max_deliveries: int = 0
    clock: Callable[[], int] | None = None
    """Milliseconds since the epoch for the relays and the store (expiry, sent_at); None = real time."""


class ConformanceBase(ABC, Generic[Body]):
    """The hooks and helpers of the relay conformance tests."""

    # -- hooks ------------------------------------------------------------------------------------

    @abstractmethod
    def make_relays(
        self, count: int, limits: Limits = Limits()
    ) -> AbstractAsyncContextManager[list[Relay[Body]]]:
        """``count`` started relays sharing one fresh, empty store (like workers on one Redis),
        built with ``limits``."""

    @abstractmethod
    def body(self, n: int) -> Body:
        """A valid body, distinct for each ``n``."""

    @abstractmethod
    def invalid_body(self) -> Body:
        """A body the contract refuses."""

    @abstractmethod
    def address(self, tier: Tier, agent: str) -> Address:
        """An address of ``tier`` for ``agent``."""

    # -- helpers ----------------------------------------------------------------------------------

    async def _agents(self, relay: Relay[Body], *names: str, tier: Tier = Tier.HOST) -> None:
        for name in names:
            await relay.register(name, self.address(tier, name), f"s-{name}")

    @staticmethod
    async def _bounded(coro: object) -> object:
        return await asyncio.wait_for(coro, WAIT_BOUND)  # type: ignore[arg-type]

    @staticmethod
    async def _until_parked(relay: Relay[Body], agent: str, count: int) -> None:
        await eventually(
            lambda: relay.parked_fetches(agent) >= count, WAIT_BOUND, f"{count} fetches of {agent} parked"
        )
