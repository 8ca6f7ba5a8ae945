"""The shared state of the memory backend: registrations and inboxes of one process.

Several ``Relay`` instances may share one ``MemoryState`` (like workers sharing one Redis). Everything
runs on one event loop, so each operation is atomic between awaits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from broker.envelope import Tier
from broker.ports import Registration


@dataclass(slots=True)
class MemoryEntry:
    position: tuple[int, int]
    nonce: str
    sender: str
    tier: Tier
    sent_at_ms: int
    fields: dict[str, str]
    deliveries: int = 0


@dataclass(slots=True)
class MemoryInbox:
    entries: dict[tuple[int, int], MemoryEntry] = field(default_factory=dict)
    last: tuple[int, int] = (0, 0)
    arrived: asyncio.Condition | None = None

    def condition(self) -> asyncio.Condition:
        if self.arrived is None:
            self.arrived = asyncio.Condition()
        return self.arrived

    def unacknowledged(self) -> int:
        return len(self.entries)

    async def wake(self) -> None:
        """Wake every waiter on this inbox, to look again."""
        if self.arrived is not None:
            async with self.arrived:
                self.arrived.notify_all()


@dataclass(slots=True)
class MemoryState:
    registrations: dict[str, Registration] = field(default_factory=dict)
    inboxes: dict[str, MemoryInbox] = field(default_factory=dict)
    inbox_cap: int | None = None
    send_rate: float = 0.0
    send_burst: int = 0
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per-sender token bucket: (tokens, monotonic time of the last refill)."""

    async def wake_all(self) -> None:
        """Wake the waiters on every inbox (a store or queue closing: they stop waiting)."""
        for inbox in self.inboxes.values():
            await inbox.wake()
