"""What is in Redis, per agent: ``relay inspect`` and the inbox gauges on ``/metrics``.

For each agent one read-only Lua call (``lua/inspect.lua``; every key it touches is in the agent's hash
slot) returns the registration hash, ``XLEN`` of the inbox, the ``XPENDING`` summary, the id of the
oldest unacknowledged entry and ``XLEN`` of the dead-letter stream. Calls for many agents go in one
pipeline. No message text leaves Redis: the oldest entry is found by id inside the script.

The stream holds exactly the unacknowledged envelopes (acknowledge deletes), and every pending
(handed out) entry is older than every entry not yet handed out, so the oldest unacknowledged entry is
the oldest pending one, or the first entry when nothing is pending. Ages compare stream ids (the
milliseconds Redis assigned at send) with Redis ``TIME``: the inspecting host's clock does not matter.

``adapters.redis.gauges.InboxGauges`` exports the same figures as Prometheus gauges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from adapters.redis.keys import DEFAULT_PREFIX, GROUP, Keys
from adapters.redis.scripts import read_script
from broker.envelope import format_time, from_ms, parse_time
from broker.errors import BackendUnavailable

__all__ = ["PIPELINE_CHUNK", "AgentInspection", "Inspector", "Report", "entry_ms", "redacted", "report"]

PIPELINE_CHUNK = 500
"""Script calls per pipeline round trip."""


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
        self._script: AsyncScript = client.register_script(read_script("inspect"))

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
        oldest_age = max(0.0, (now_ms - entry_ms(oldest_id)) / 1000)
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


def entry_ms(entry_id: str) -> int:
    """The milliseconds part of a stream entry id (``1764423912345-0``): when Redis added it."""
    return int(entry_id.partition("-")[0])


def redacted(url: str) -> str:
    """``url`` with any user and password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.partition('@')[2]}"
