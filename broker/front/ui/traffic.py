"""Per-tier traffic over time, from the relay's own counters, sampled in this process.

``Traffic`` reads ``csf_relay_envelopes_sent`` and ``csf_relay_envelopes_delivered`` (by tier) every
``interval`` seconds into a ring of ``capacity`` samples; the dashboard draws the rate between
neighbouring samples. The counters are this worker's: with several workers, each shows its own share.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import Counter

from broker.envelope import Tier
from broker.metrics import RelayMetrics

DEFAULT_INTERVAL = 5.0
DEFAULT_CAPACITY = 720
"""Samples kept: an hour at the default interval."""
TIERS = tuple(tier.label for tier in Tier)


@dataclass(frozen=True, slots=True)
class Sample:
    at_ms: int
    sent: dict[str, float]
    delivered: dict[str, float]


def _by_tier(counter: Counter) -> dict[str, float]:
    found = dict.fromkeys(TIERS, 0.0)
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("tier") in found:
                found[sample.labels["tier"]] = sample.value
    return found


class Traffic:
    def __init__(
        self, metrics: RelayMetrics, interval: float = DEFAULT_INTERVAL, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        self.metrics = metrics
        self.interval = interval
        self.samples: deque[Sample] = deque(maxlen=capacity)

    def take(self) -> Sample:
        """The counters now (not kept)."""
        return Sample(int(time.time() * 1000), _by_tier(self.metrics.sent), _by_tier(self.metrics.delivered))

    def sample(self) -> None:
        self.samples.append(self.take())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Sample every ``interval`` seconds while the context is open."""

        async def loop() -> None:
            while True:
                self.sample()
                await asyncio.sleep(self.interval)

        task = asyncio.create_task(loop(), name="relay-dashboard-traffic")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def series(self) -> dict[str, object]:
        """Envelopes per second, sent and delivered, by tier, between neighbouring samples, plus a
        sample taken now (so the newest point is current)."""
        points = [*self.samples, self.take()]
        rows = []
        for before, after in itertools.pairwise(points):
            span = max((after.at_ms - before.at_ms) / 1000, 1e-3)
            rows.append(
                {
                    "at_ms": after.at_ms,
                    "sent": {t: max(0.0, (after.sent[t] - before.sent[t]) / span) for t in TIERS},
                    "delivered": {
                        t: max(0.0, (after.delivered[t] - before.delivered[t]) / span) for t in TIERS
                    },
                }
            )
        last = points[-1]
        return {
            "tiers": list(TIERS),
            "interval": self.interval,
            "points": rows,
            "totals": {"sent": last.sent, "delivered": last.delivered},
        }
