"""What is in Redis, per agent: ``relay inspect`` and the inbox gauges on ``/metrics``.

For each agent one read-only Lua call (``INSPECT_LUA``; every key it touches is in the agent's hash
slot) returns the registration hash, ``XLEN`` of the inbox, the ``XPENDING`` summary, the id of the
oldest unacknowledged entry and ``XLEN`` of the dead-letter stream. Calls for many agents go in one
pipeline. No message text leaves Redis: the oldest entry is found by id inside the script.

The stream holds exactly the unacknowledged envelopes (acknowledge deletes), and every pending
(handed out) entry is older than every entry not yet handed out, so the oldest unacknowledged entry is
the oldest pending one, or the first entry when nothing is pending. Ages compare stream ids (the
milliseconds Redis assigned at send) with Redis ``TIME``: the inspecting host's clock does not matter.

``InboxGauges`` exports the same figures as Prometheus gauges, refreshed by ``await refresh()`` before
each scrape with bounded work: at most ``batch`` agents are read per refresh, walking the agent index
with ``SSCAN`` across scrapes, so totals cover every agent after ``ceil(agents / batch)`` scrapes; at
most ``max_series`` agents get per-agent series. See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from adapters.redis.keys import DEFAULT_PREFIX, GROUP, Keys
from broker.envelope import Tier, format_time, from_ms, parse_time
from broker.errors import BackendUnavailable

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_MAX_SERIES",
    "INSPECT_LUA",
    "AgentInspection",
    "InboxGauges",
    "Inspector",
    "Report",
    "redacted",
    "report",
]

DEFAULT_BATCH = 500
"""Agents read from Redis per ``InboxGauges.refresh`` (one pipeline of that many script calls)."""
DEFAULT_MAX_SERIES = 200
"""Agents that get per-agent series (the ``agent`` label's cardinality bound, per metric)."""
PIPELINE_CHUNK = 500
"""Script calls per pipeline round trip."""
MAX_SSCAN_CALLS = 8
"""SSCAN round trips per refresh, at most, to fill the queue of agents to read."""

INSPECT_LUA = """\
-- inspect: one agent's figures, read-only; no message text is returned.
-- KEYS[1] registration hash   KEYS[2] inbox stream   KEYS[3] dead-letter stream
-- ARGV[1] consumer group
-- Returns {registration as field, value, ...; XLEN inbox; pending count; oldest unacknowledged entry id
-- or ''; XLEN dead letters}.
local registration = redis.call('HGETALL', KEYS[1])
local depth = redis.call('XLEN', KEYS[2])
local pending, oldest = 0, ''
local summary = redis.pcall('XPENDING', KEYS[2], ARGV[1])
if type(summary) == 'table' and not summary.err and summary[1] > 0 then
  pending = summary[1]
  oldest = summary[2]
end
if oldest == '' and depth > 0 then
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if first then
    oldest = first[1]
  end
end
return {registration, depth, pending, oldest, redis.call('XLEN', KEYS[3])}
"""


@dataclass(frozen=True, slots=True)
class AgentInspection:
    """One agent as Redis has it. Ages are seconds, measured against Redis ``TIME``."""

    agent: str
    registered: bool
    provider: str | None
    endpoint: str | None
    tier: str | None
    session: str | None
    registered_at: str | None
    updated_at: str | None
    age_seconds: float | None
    """Since ``registered_at`` (the first registration; re-registering keeps it)."""
    inbox_depth: int
    """Unacknowledged envelopes (``XLEN``: acknowledged ones are deleted)."""
    pending: int
    """Handed out by a fetch and not yet acknowledged (``XPENDING``)."""
    oldest_unacked_entry: str | None
    oldest_unacked_seconds: float | None
    """Age of the oldest unacknowledged envelope; None when the inbox is empty."""
    dead_letters: int

    @property
    def not_yet_fetched(self) -> int:
        return max(0, self.inbox_depth - self.pending)

    @property
    def exists(self) -> bool:
        """Anything in Redis for this agent at all."""
        return self.registered or self.inbox_depth > 0 or self.dead_letters > 0

    def to_json(self) -> dict[str, object]:
        return {
            "agent": self.agent,
            "registered": self.registered,
            "provider": self.provider,
            "endpoint": self.endpoint,
            "tier": self.tier,
            "session": self.session,
            "registered_at": self.registered_at,
            "updated_at": self.updated_at,
            "age_seconds": self.age_seconds,
            "inbox_depth": self.inbox_depth,
            "pending": self.pending,
            "not_yet_fetched": self.not_yet_fetched,
            "oldest_unacked_entry": self.oldest_unacked_entry,
            "oldest_unacked_seconds": self.oldest_unacked_seconds,
            "dead_letters": self.dead_letters,
        }


class Inspector:
    """The inspection queries against one Redis (any async client; ``decode_responses=True``)."""

    def __init__(self, client: Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._script: AsyncScript = client.register_script(INSPECT_LUA)

    async def now_ms(self) -> int:
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def agent_count(self) -> int:
        return int(await self.client.scard(self.keys.agents()))

    async def agent_ids(self, limit: int) -> list[str]:
        """Registered agent ids, sorted, at most ``limit`` (reads the whole index: for the CLI)."""
        members = await self.client.smembers(self.keys.agents())
        return sorted(str(m) for m in members)[:limit]

    async def inspect(self, agents: Sequence[str], now_ms: int | None = None) -> list[AgentInspection]:
        """Figures for ``agents`` (ids already checked), in order; pipelined."""
        if now_ms is None:
            now_ms = await self.now_ms()
        found: list[AgentInspection] = []
        for start in range(0, len(agents), PIPELINE_CHUNK):
            chunk = agents[start : start + PIPELINE_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for agent in chunk:
                keys = self.keys
                await self._script(
                    keys=[keys.registration(agent), keys.inbox(agent), keys.dead_letters(agent)],
                    args=[GROUP],
                    client=pipe,
                )
            replies = await pipe.execute()
            found.extend(_inspection(a, r, now_ms) for a, r in zip(chunk, replies, strict=True))
        return found


def _inspection(agent: str, reply: object, now_ms: int) -> AgentInspection:
    if not isinstance(reply, list) or len(reply) != 5:
        raise ValueError(f"unexpected inspect reply for {agent!r}: {reply!r}")
    flat, depth, pending, oldest, dead = reply
    pairs = [str(x) for x in flat] if isinstance(flat, list) else []
    row = dict(zip(pairs[::2], pairs[1::2], strict=True))
    registered_at = row.get("registered_at")
    age = None
    if registered_at:
        with contextlib.suppress(ValueError):
            age = max(0.0, now_ms / 1000 - parse_time(registered_at).timestamp())
    oldest_id = str(oldest) if oldest else None
    oldest_age = None
    if oldest_id is not None:
        oldest_age = max(0.0, (now_ms - _entry_ms(oldest_id)) / 1000)
    return AgentInspection(
        agent=agent,
        registered=bool(row),
        provider=row.get("provider"),
        endpoint=row.get("endpoint"),
        tier=row.get("tier"),
        session=row.get("session"),
        registered_at=registered_at,
        updated_at=row.get("updated_at"),
        age_seconds=age,
        inbox_depth=int(str(depth)),
        pending=int(str(pending)),
        oldest_unacked_entry=oldest_id,
        oldest_unacked_seconds=oldest_age,
        dead_letters=int(str(dead)),
    )


@dataclass(frozen=True, slots=True)
class Report:
    """What ``relay inspect`` prints."""

    redis: str
    """The Redis URL, password hidden."""
    time: str
    """Redis ``TIME`` when the figures were read (ISO-8601 UTC)."""
    indexed: int
    """Registered agents in the index (``SCARD``)."""
    agents: list[AgentInspection]


async def report(
    url: str,
    *,
    agent: str | None = None,
    limit: int = 1000,
    prefix: str = DEFAULT_PREFIX,
    socket_timeout: float = 5.0,
) -> Report:
    """Inspect one agent, or the first ``limit`` registered agents by id, on the Redis at ``url``.

    Raises:
        BackendUnavailable: Redis cannot be reached or read; the message names the (redacted) URL.
    """
    shown = redacted(url)
    client: Redis = Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=min(socket_timeout, 2.0),
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        inspector = Inspector(client, Keys(prefix))
        now_ms = await inspector.now_ms()
        indexed = await inspector.agent_count()
        agents = [agent] if agent is not None else await inspector.agent_ids(limit)
        found = await inspector.inspect(agents, now_ms)
    except (RedisError, OSError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise BackendUnavailable(
            f"cannot read Redis at {shown} ({detail}); is it running, and is it the one relay serve uses?"
        ) from exc
    finally:
        await client.aclose()
    return Report(redis=shown, time=format_time(from_ms(now_ms)), indexed=indexed, agents=found)


def _entry_ms(entry_id: str) -> int:
    """The milliseconds part of a stream entry id (``1764423912345-0``): when Redis added it."""
    return int(entry_id.partition("-")[0])


def redacted(url: str) -> str:
    """``url`` with any user and password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.partition('@')[2]}"


# --- Prometheus -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Figure:
    inspection: AgentInspection
    read_at_ms: int


class InboxGauges(Collector):
    """Per-agent inbox gauges computed from Redis, refreshed before each scrape.

    Register it on the relay's ``CollectorRegistry`` and ``await refresh()`` before
    ``generate_latest`` (the front's ``before_metrics`` hook does, with a timeout). ``collect`` only
    reads the cached figures, so it never touches Redis or blocks the event loop.

    Work per refresh is bounded: ``TIME`` + ``SCARD``, at most ``MAX_SSCAN_CALLS`` ``SSCAN`` calls of
    ``COUNT batch``, and one script call for each of at most ``batch`` agents (one pipeline per
    ``PIPELINE_CHUNK``). Agents are visited in ``SSCAN`` order, continuing where the last refresh
    stopped; with at most ``batch`` agents every refresh reads every agent. After a complete pass over
    the index, figures of agents no longer in it are dropped. Concurrent scrapes share one refresh.

    Series: per-agent gauges for at most ``max_series`` agents (all of them when there are no more;
    otherwise the worst by oldest unacknowledged age, backlog and dead letters, a third each), and
    totals over every agent read so far, without the agent label.
    """

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        *,
        batch: int = DEFAULT_BATCH,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        if batch < 1 or max_series < 0:
            raise ValueError("batch must be >= 1 and max_series >= 0")
        self.inspector = Inspector(client, keys)
        self.batch = batch
        self.max_series = max_series
        self._figures: dict[str, _Figure] = {}
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._cursor = 0
        self._scan_done = False
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
        client = self.inspector.client
        pipe = client.pipeline(transaction=False)
        pipe.time()
        pipe.scard(self.inspector.keys.agents())
        (seconds, micros), indexed = await pipe.execute()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        self._indexed = int(indexed)
        calls = 0
        while len(self._queue) < self.batch and not self._scan_done and calls < MAX_SSCAN_CALLS:
            cursor, members = await client.sscan(self.inspector.keys.agents(), self._cursor, count=self.batch)
            calls += 1
            for member in members:
                agent = str(member)
                if agent not in self._queued:
                    self._queued.add(agent)
                    self._queue.append(agent)
            self._cursor = int(cursor)
            self._scan_done = self._cursor == 0
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
        if self._scan_done and not self._queue:
            for gone in self._figures.keys() - self._queued:
                del self._figures[gone]
            self._queued.clear()
            self._scan_done = False
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
        return max(0.0, (self._now_ms - _entry_ms(inspection.oldest_unacked_entry)) / 1000)

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
        coverage.add_metric(["indexed"], float(self._indexed))
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
