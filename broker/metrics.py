"""The csf_relay_* Prometheus metrics, on an explicit CollectorRegistry (never the global one)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broker.credentials import EVENTS, CredentialEvent
from broker.envelope import Tier
from broker.ports import ICredentials


class RelayMetrics:
    """Counters a relay updates. Every tier label exists from the start, so dashboards see zeros."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.sent = Counter(
            "csf_relay_envelopes_sent",
            "Envelopes accepted by send, by the widest tier between sender and recipient.",
            ["tier"],
            registry=self.registry,
        )
        self.delivered = Counter(
            "csf_relay_envelopes_delivered",
            "Envelopes handed to their recipient for the first time (re-fetches do not count).",
            ["tier"],
            registry=self.registry,
        )
        self.acknowledged = Counter(
            "csf_relay_envelopes_acknowledged",
            "Envelopes acknowledged by their recipient.",
            registry=self.registry,
        )
        self.refused = Counter(
            "csf_relay_refusals",
            "Requests refused, by stable error code.",
            ["code"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "csf_relay_dead_letters",
            "Envelopes moved to a dead-letter list after failing delivery too often.",
            ["tier"],
            registry=self.registry,
        )
        self.notices = Counter(
            "csf_relay_notices",
            "Mail-pending waits answered with a notice, by kind (new mail, or a reminder).",
            ["kind"],
            registry=self.registry,
        )
        self.parked = Gauge(
            "csf_relay_long_polls_parked",
            "Long-poll fetches (FetchAgentInbox with wait_ms) and mail-pending waits (POST /agent/wait) "
            "parked in this process now (at most 16 per agent).",
            registry=self.registry,
        )
        for kind in ("new", "reminder"):
            self.notices.labels(kind=kind)
        self.expired = Counter(
            "csf_relay_envelopes_expired",
            "Envelopes whose ttl passed before they were acknowledged, moved to the dead letters.",
            ["tier"],
            registry=self.registry,
        )
        for tier in Tier:
            self.dead_lettered.labels(tier=tier.label)
            self.expired.labels(tier=tier.label)
        self._sent = {tier: self.sent.labels(tier=tier.label) for tier in Tier}
        self._delivered = {tier: self.delivered.labels(tier=tier.label) for tier in Tier}

    def count_sent(self, tier: Tier) -> None:
        self._sent[tier].inc()

    def count_delivered(self, tier: Tier, n: int = 1) -> None:
        self._delivered[tier].inc(n)

    def count_dead(self, tier: Tier, reason: str) -> None:
        """One envelope moved to the dead letters by fetch or a sweep: ``expired`` or a dead letter."""
        counter = self.expired if reason == "expired" else self.dead_lettered
        counter.labels(tier=tier.label).inc()


class CredentialCounts(Collector):
    """``csf_relay_credentials_total{event}``: credentials issued, exchanged, revoked and refused
    exchanges, as the store counts them across every worker and the ``relay credentials`` command
    (so every worker shows the same figures). ``refresh`` reads them before each scrape (the front's
    ``before_metrics``); ``collect`` shows the last figures read, never touching the store."""

    def __init__(self, store: ICredentials) -> None:
        self.store = store
        self._counts: dict[CredentialEvent, int] = dict.fromkeys(EVENTS, 0)

    async def refresh(self) -> None:
        self._counts = await self.store.events()

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "csf_relay_credentials",
            "Per-agent credentials issued, exchanged for tokens and revoked, and exchanges refused.",
            labels=["event"],
        )
        for event in EVENTS:
            family.add_metric([event], self._counts.get(event, 0))
        yield family

    def describe(self) -> Iterable[Metric]:
        return self.collect()
