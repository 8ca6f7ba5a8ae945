"""What is in Redis, per agent: ``relay inspect`` and the inbox gauges on ``/metrics``.

For each agent one read-only Lua call (``lua/inspect.lua``; every key it touches is in the agent's hash
slot) returns the registration hash, ``XLEN`` of the inbox, the ``XPENDING`` summary, the id of the
oldest unacknowledged entry, ``XLEN`` of the dead-letter stream and how many envelopes expired or hit
the delivery limit. Calls for many agents are
auto-pipelined (per node on a cluster). No message text leaves Redis: the oldest entry is found by id
inside the script. The agents are listed by the directory (``adapters/redis/directory.py``).

The stream holds exactly the unacknowledged envelopes (acknowledge deletes), and every pending
(handed out) entry is older than every entry not yet handed out, so the oldest unacknowledged entry is
the oldest pending one, or the first entry when nothing is pending. Ages compare stream ids (the
milliseconds Redis assigned at send) with Redis ``TIME``: the inspecting host's clock does not matter.

``adapters.redis.gauges.InboxGauges`` exports the same figures as Prometheus gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.directory import Directory
from adapters.redis.entries import entry_ms
from adapters.redis.keys import DEFAULT_PREFIX
from adapters.redis.protocol_operator import inspect_call
from broker.envelope import format_ms, parse_ms
from broker.errors import BackendUnavailable

__all__ = [
    "PIPELINE_CHUNK",
    "AgentInspection",
    "Inspector",
    "Report",
    "entry_ms",
    "redacted",
    "report",
]

PIPELINE_CHUNK = 500
"""Script calls in flight at once, at most."""


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
    last_seen_ms: int | None = None
    """The agent's last sign (``broker.presence``; ms of Redis ``TIME``)."""
    ended_at_ms: int | None = None
    """When its registered session said it ended (``leave.lua``)."""
    expired: int = 0
    """Envelopes of this inbox that expired unacknowledged (moved to the dead letters), ever."""
    poisoned: int = 0
    """Envelopes of this inbox dead-lettered at fetch after ``--max-deliveries`` hand-outs, ever."""

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
            "last_seen": None if self.last_seen_ms is None else format_ms(self.last_seen_ms),
            "expired": self.expired,
            "poisoned": self.poisoned,
        }


class Inspector:
    """The inspection queries, on a worker's (or the CLI's) ``RedisConnection``."""

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys
        self.directory = Directory(connection)

    async def now_ms(self) -> int:
        async def run(client: Redis | RedisCluster) -> int:
            seconds, micros = await client.time()
            return int(seconds) * 1000 + int(micros) // 1000

        return await self.connection.call(run, idempotent=True)

    async def agent_ids(self, limit: int) -> list[str]:
        """Registered agent ids, sorted, at most ``limit`` (a full listing: for the CLI)."""
        return (await self.directory.agents())[:limit]

    async def inspect(self, agents: Sequence[str], now_ms: int | None = None) -> list[AgentInspection]:
        """Figures for ``agents`` (ids already checked), in order."""
        if now_ms is None:
            now_ms = await self.now_ms()
        keys, script = self.keys, self.connection.scripts.inspect
        found: list[AgentInspection] = []
        for start in range(0, len(agents), PIPELINE_CHUNK):
            chunk = agents[start : start + PIPELINE_CHUNK]
            replies = await asyncio.gather(
                *(
                    self.connection.script(script, call.keys, call.args, idempotent=True)
                    for call in (inspect_call(keys, a) for a in chunk)
                )
            )
            found.extend(_inspection(a, r, now_ms) for a, r in zip(chunk, replies, strict=True))
        return found


def _inspection(agent: str, reply: object, now_ms: int) -> AgentInspection:
    if not isinstance(reply, list) or len(reply) != 6:
        raise ValueError(f"unexpected inspect reply for {agent!r}: {reply!r}")
    flat, depth, pending, oldest, dead, (expired, poisoned) = reply
    pairs = [str(x) for x in flat] if isinstance(flat, list) else []
    row = dict(zip(pairs[::2], pairs[1::2], strict=True))
    registered_at = row.get("registered_at")
    age = None
    if registered_at:
        with contextlib.suppress(ValueError):
            age = max(0.0, (now_ms - parse_ms(registered_at)) / 1000)
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
        last_seen_ms=int(row["seen_at"]) if row.get("seen_at", "").isdigit() else None,
        ended_at_ms=int(row["ended_at"]) if row.get("ended_at", "").isdigit() else None,
        expired=int(str(expired)),
        poisoned=int(str(poisoned)),
    )


@dataclass(frozen=True, slots=True)
class Report:
    """What ``relay inspect`` prints."""

    redis: str
    """The Redis URL, password hidden."""
    time: str
    """Redis ``TIME`` when the figures were read (ISO-8601 UTC)."""
    indexed: int
    """Registered agents (the directory's full listing)."""
    agents: list[AgentInspection]


async def report(
    url: str,
    *,
    agent: str | None = None,
    limit: int = 1000,
    prefix: str = DEFAULT_PREFIX,
    socket_timeout: float = 5.0,
) -> Report:
    """Inspect one agent, or the first ``limit`` registered agents by id, on the Redis (or cluster)
    at ``url``.

    Raises:
        BackendUnavailable: Redis cannot be reached or read; the message names the (redacted) URL.
    """
    shown = redacted(url)
    settings = RedisSettings(
        url=url, prefix=prefix, command_timeout=socket_timeout, connect_timeout=min(socket_timeout, 2.0)
    )
    connection = RedisConnection(settings)
    await connection.open()
    try:
        inspector = Inspector(connection)
        now_ms = await inspector.now_ms()
        everyone = await inspector.directory.agents()
        agents = [agent] if agent is not None else everyone[:limit]
        found = await inspector.inspect(agents, now_ms)
    except BackendUnavailable as exc:
        raise BackendUnavailable(
            f"cannot read Redis at {shown} ({exc.message}); is it running, and is it the one relay "
            "serve uses?"
        ) from exc
    finally:
        await connection.close()
    return Report(redis=shown, time=format_ms(now_ms), indexed=len(everyone), agents=found)


def redacted(url: str) -> str:
    """``url`` with any user and password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.partition('@')[2]}"
