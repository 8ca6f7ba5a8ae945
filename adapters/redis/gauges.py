"""``InboxGauges``: the figures of ``relay inspect`` as Prometheus gauges on ``/metrics``.

Refreshed before each scrape with bounded work: at most ``batch`` agents are read per refresh, walking
the directory in pages (``adapters/redis/directory.py``) across scrapes, so totals cover every agent
after about ``ceil(agents / batch)`` scrapes; at most ``max_series`` agents get per-agent series.
See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from adapters.redis.connection import RedisConnection
from adapters.redis.directory import Walk
from adapters.redis.entries import entry_ms
from adapters.redis.inspect import AgentInspection, Inspector
from broker.envelope import Tier

DEFAULT_BATCH = 500
"""Agents read from Redis per ``InboxGauges.refresh`` (one pipeline of that many script calls)."""
DEFAULT_MAX_SERIES = 200
"""Agents that get per-agent series (the ``agent`` label's cardinality bound, per metric)."""
MAX_DIRECTORY_PAGES = 8
"""Directory pages (index reads, or ``SCAN`` calls on a store whose index is not built) per refresh, at
most, to fill the queue of agents to read."""


@dataclass(frozen=True, slots=True)
class _Figure:
    inspection: AgentInspection
    read_at_ms: int


class InboxGauges(Collector):
    """Per-agent inbox gauges computed from Redis, refreshed before each scrape.

    Register it on the relay's ``CollectorRegistry`` and ``await refresh()`` before
    ``generate_latest`` (the front's ``before_metrics`` hook does, with a timeout). ``collect`` only
    reads the cached figures, so it never touches Redis or blocks the event loop.

    Work per refresh is bounded: ``TIME``, at most ``MAX_DIRECTORY_PAGES`` directory pages, and one
    script call for each of at most ``batch`` agents (auto-pipelined). Agents are visited in directory
    order, continuing where the last refresh stopped. After a complete pass over the registrations, figures of
    agents no longer registered are dropped, and ``indexed`` is the number that pass found. Concurrent
    scrapes share one refresh.

    Series: per-agent gauges for at most ``max_series`` agents (all of them when there are no more;
    otherwise the worst by oldest unacknowledged age, backlog and dead letters, a third each), and
    totals over every agent read so far, without the agent label.
    """

    def __init__(
        self,
        connection: RedisConnection,
        *,
        batch: int = DEFAULT_BATCH,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        if batch < 1 or max_series < 0:
            raise ValueError("batch must be >= 1 and max_series >= 0")
        self.inspector = Inspector(connection)
        self.batch = batch
        self.max_series = max_series
        self._figures: dict[str, _Figure] = {}
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._walk = Walk()
        self._seen = 0
        self._indexed = 0
        self._now_ms = 0
        self._up = False
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the next batch of agents from Redis. Raises on Redis errors (``up`` becomes 0 and
        the last figures stay); a refresh that is already running is waited for, not repeated."""
        if self._lock.locked():
            async with self._lock:
                return
        async with self._lock:
            self._up = False
            await self._refresh()
            self._up = True

    async def _refresh(self) -> None:
        now_ms = await self.inspector.now_ms()
        calls = 0
        while len(self._queue) < self.batch and not self._walk.done and calls < MAX_DIRECTORY_PAGES:
            calls += 1
            for agent in await self.inspector.directory.page(self._walk):
                if agent not in self._queued:
                    self._queued.add(agent)
                    self._queue.append(agent)
                    self._seen += 1
        take = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
        try:
            found = await self.inspector.inspect(take, now_ms)
        except BaseException:
            self._queue.extendleft(reversed(take))
            raise
        for inspection in found:
            if inspection.registered:
                self._figures[inspection.agent] = _Figure(inspection, now_ms)
            else:
                self._figures.pop(inspection.agent, None)
        if self._walk.done and not self._queue:
            for gone in self._figures.keys() - self._queued:
                del self._figures[gone]
            self._queued.clear()
            self._indexed, self._seen = self._seen, 0
            self._walk = Walk()
        self._now_ms = now_ms

    def labelled(self) -> list[AgentInspection]:
        """The agents that get per-agent series (at most ``max_series``), sorted by id."""
        everyone = [f.inspection for f in self._figures.values()]
        if len(everyone) <= self.max_series:
            return sorted(everyone, key=lambda i: i.agent)
        share = math.ceil(self.max_series / 3)
        rankings: tuple[Callable[[AgentInspection], float], ...] = (
            self.oldest_unacked_seconds,
            lambda i: float(i.inbox_depth),
            lambda i: float(i.dead_letters),
        )
        chosen: dict[str, AgentInspection] = {}
        for rank in rankings:
            worst = sorted((i for i in everyone if rank(i) > 0), key=lambda i: (-rank(i), i.agent))
            for inspection in worst[:share]:
                if len(chosen) < self.max_series:
                    chosen.setdefault(inspection.agent, inspection)
        return sorted(chosen.values(), key=lambda i: i.agent)

    def oldest_unacked_seconds(self, inspection: AgentInspection) -> float:
        """Age of the agent's oldest unacknowledged envelope at the last refresh's Redis time (figures
        read by earlier refreshes age with it); 0 when its inbox was empty."""
        if inspection.oldest_unacked_entry is None:
            return 0.0
        return max(0.0, (self._now_ms - entry_ms(inspection.oldest_unacked_entry)) / 1000)

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def describe(self) -> Iterable[Metric]:
        """The families (names only matter): lets ``CollectorRegistry.register`` refuse a clash with
        another metric's name instead of exporting two families under one name."""
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        everyone = [f.inspection for f in self._figures.values()]
        labelled = self.labelled()
        per_agent = (
            ("csf_relay_inbox_depth", "Unacknowledged envelopes in the agent's inbox (XLEN).", "inbox_depth"),
            (
                "csf_relay_inbox_pending",
                "Envelopes handed out to the agent and not yet acknowledged (XPENDING).",
                "pending",
            ),
            (
                "csf_relay_inbox_oldest_unacked_seconds",
                "Age of the agent's oldest unacknowledged envelope; 0 when the inbox is empty.",
                "oldest_unacked_seconds",
            ),
            (
                "csf_relay_dead_letter_depth",
                "Envelopes in the agent's dead-letter stream (XLEN).",
                "dead_letters",
            ),
            (
                "csf_relay_inbox_expired",
                "Envelopes of the agent's inbox that expired unacknowledged.",
                "expired",
            ),
            (
                "csf_relay_inbox_poisoned",
                "Envelopes of the agent's inbox dead-lettered after --max-deliveries hand-outs.",
                "poisoned",
            ),
        )
        for name, text, attribute in per_agent:
            family = GaugeMetricFamily(
                name, f"{text} At most {self.max_series} agents; see docs/operations.md.", labels=["agent"]
            )
            for inspection in labelled:
                if attribute == "oldest_unacked_seconds":
                    family.add_metric([inspection.agent], self.oldest_unacked_seconds(inspection))
                else:
                    family.add_metric([inspection.agent], float(getattr(inspection, attribute)))
            yield family
        tiers = GaugeMetricFamily(
            "csf_relay_registered_agents", "Registered agents by tier (agents read so far).", labels=["tier"]
        )
        for tier in Tier:
            tiers.add_metric([tier.label], float(sum(1 for i in everyone if i.tier == tier.label)))
        yield tiers
        totals = (
            ("csf_relay_total_inbox_depth", "Unacknowledged envelopes in all inboxes.", "inbox_depth"),
            ("csf_relay_total_inbox_pending", "Handed out, unacknowledged, all inboxes.", "pending"),
            ("csf_relay_total_dead_letter_depth", "Envelopes in all dead-letter streams.", "dead_letters"),
        )
        for name, text, attribute in totals:
            yield GaugeMetricFamily(name, text, value=float(sum(getattr(i, attribute) for i in everyone)))
        yield GaugeMetricFamily(
            "csf_relay_max_inbox_oldest_unacked_seconds",
            "Age of the oldest unacknowledged envelope in any inbox; 0 when all are empty.",
            value=max((self.oldest_unacked_seconds(i) for i in everyone), default=0.0),
        )
        coverage = GaugeMetricFamily(
            "csf_relay_inspection_agents",
            "Agents in the registry index (indexed), whose figures are in the totals (covered), and "
            "with per-agent series (labelled).",
            labels=["set"],
        )
        coverage.add_metric(["indexed"], float(max(self._indexed, self._seen)))
        coverage.add_metric(["covered"], float(len(everyone)))
        coverage.add_metric(["labelled"], float(len(labelled)))
        yield coverage
        oldest_read = min((f.read_at_ms for f in self._figures.values()), default=self._now_ms)
        yield GaugeMetricFamily(
            "csf_relay_inspection_staleness_seconds",
            "Age of the oldest per-agent figure in the totals, at the last refresh.",
            value=max(0.0, (self._now_ms - oldest_read) / 1000),
        )
        yield GaugeMetricFamily(
            "csf_relay_inspection_up",
            "1 if the last refresh of these gauges from Redis succeeded, else 0 (figures are stale).",
            value=1.0 if self._up else 0.0,
        )
