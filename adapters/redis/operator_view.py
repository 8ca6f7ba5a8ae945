"""``RedisOperatorView``: the read-only operator queries of ``broker.ports.IOperatorView`` on Redis.

- ``agents``: the registered agents the directory lists, then one read-only ``inspect.lua`` call
  per agent (registration hash, ``XLEN``, the ``XPENDING`` summary, the oldest entry id, dead-letter
  ``XLEN``), auto-pipelined per node by ``Inspector``: never reads an envelope.
- ``unacknowledged``: ``peek.lua`` (``XRANGE`` plus the ``XPENDING`` counts of the same range), which
  neither reads through the consumer group nor counts a delivery.
- ``thread``: the index walk of ``adapters/redis/threads.py`` (in proportion to the thread), from the
  agents the directory lists (in proportion to the agents, never to the keyspace); when the
  index knows nothing of the envelope, pages of ``peek.lua`` over every inbox and ``XRANGE`` pages of
  every history (in pipelined rounds), linked by ``in_reply_to``.
- ``history``: ``XRANGE`` pages of the agent's history stream within the time range (its ids are the
  times envelopes left the inbox), filtered by ``broker.history.Walk``; one agent's key only.
- ``follow``: a ``SUBSCRIBE`` to the wake-up channel (every send publishes the recipient's id), and an
  ``XRANGE`` of that inbox after the last entry shown: a read, never a fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import archived, entry_ms, rows
from adapters.redis.inspect import AgentInspection, Inspector
from adapters.redis.protocol_operator import peek_call
from adapters.redis.threads import walk
from adapters.redis.wake import subscriber_client
from broker.envelope import Tier
from broker.errors import BackendUnavailable
from broker.history import Walk, check_cursor
from broker.ids import decode_envelope_id
from broker.ports import (
    EVERYTHING,
    AgentOverview,
    AgentsPage,
    Archived,
    HistoryPage,
    HistoryQuery,
    StoredEnvelope,
)
from broker.threads import linked

PAGE = 1000
"""Entries one ``peek.lua`` call returns at most while walking every inbox."""
PIPELINE_CHUNK = 200
"""Inboxes read at once while walking every inbox."""
HISTORY_CHUNK = 200
"""History entries one ``XRANGE`` of ``history`` reads at most."""


def _bound(ms: int | None, open_end: str) -> str:
    """A stream range bound of a time in ms (inclusive), or the open end."""
    return open_end if ms is None else str(max(ms, 0))


class RedisOperatorView:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys
        self.inspector = Inspector(connection)

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def now_ms(self) -> int:
        return await self.inspector.now_ms()

    async def agents(self, limit: int = 1000, after: str | None = None) -> AgentsPage:
        now = await self.now_ms()
        everyone = await self.inspector.directory.agents()
        chosen = [a for a in everyone if after is None or a > after][:limit]
        found = await self.inspector.inspect(chosen, now)
        return AgentsPage([overview(i) for i in found if i.registered], len(everyone), now)

    async def unacknowledged(
        self, agent: str, limit: int = 100, after: str | None = None
    ) -> list[StoredEnvelope]:
        start = "-"
        if after is not None:
            ms, seq, _ = decode_envelope_id(after)
            start = f"({ms}-{seq}"
        return await self._peek(agent, start, limit)

    async def _peek(self, agent: str, start: str, limit: int) -> list[StoredEnvelope]:
        call = peek_call(self.keys, agent, start, limit)
        reply = await self.connection.script(
            self.connection.scripts.peek, call.keys, call.args, idempotent=True
        )
        return rows(agent, reply)

    async def thread(self, envelope_id: str, limit: int = 1000) -> list[StoredEnvelope]:
        agents = await self.inspector.directory.agents()
        found = await walk(self.connection, envelope_id, agents)
        if not found:  # not indexed (sent before the index, or never stored): the old scan decides
            found = await self._everything()
        return linked(envelope_id, found, limit)

    async def history(
        self, agent: str, query: HistoryQuery = EVERYTHING, limit: int = 100, after: str | None = None
    ) -> HistoryPage:
        walk = Walk(query, limit)
        start = f"({check_cursor(after)}" if after is not None else _bound(query.since_ms, "-")
        end = _bound(query.until_ms, "+")
        while True:
            chunk = min(walk.wants(), HISTORY_CHUNK)
            found = await self._archived(agent, start, end, chunk)
            for entry in found:
                if not walk.feed(entry):
                    return walk.page()
            if len(found) < chunk:
                return walk.page()
            start = f"({found[-1].cursor}"

    async def _archived(self, agent: str, start: str, end: str, count: int) -> list[Archived]:
        key = self.keys.history(agent)

        async def run(client: Redis | RedisCluster) -> list[Archived]:
            reply = await client.xrange(key, start, end, count=count)
            return [archived(agent, str(i), values) for i, values in reply or []]

        return await self.connection.call(run, idempotent=True)

    async def _everything(self) -> list[StoredEnvelope]:
        """Every stored envelope of every inbox and history (for ``thread``: an occasional query, not
        a hot one)."""
        agents = await self.inspector.directory.agents()
        found: list[StoredEnvelope] = []
        for begin in range(0, len(agents), PIPELINE_CHUNK):
            left = {a: "-" for a in agents[begin : begin + PIPELINE_CHUNK]}
            while left:
                names = list(left)
                pages = await asyncio.gather(*(self._archived(a, left[a], "+", PAGE) for a in names))
                for agent, kept in zip(names, pages, strict=True):
                    found.extend(a.envelope for a in kept)
                    if len(kept) < PAGE:
                        del left[agent]
                    else:
                        left[agent] = f"({kept[-1].cursor}"
        for begin in range(0, len(agents), PIPELINE_CHUNK):
            todo = {a: "-" for a in agents[begin : begin + PIPELINE_CHUNK]}
            while todo:
                names = list(todo)
                peeks = await asyncio.gather(*(self._peek(a, todo[a], PAGE) for a in names))
                for agent, peeked in zip(names, peeks, strict=True):
                    found.extend(peeked)
                    if len(peeked) < PAGE:
                        del todo[agent]
                    else:
                        ms, seq, _ = decode_envelope_id(peeked[-1].envelope_id)
                        todo[agent] = f"({ms}-{seq}"
        return found

    async def follow(self, agent: str | None = None) -> AsyncIterator[StoredEnvelope]:
        channel = self.keys.wake_channel()
        client = await subscriber_client(self.connection)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                while (await pubsub.get_message(timeout=5.0)) is None:
                    pass  # the subscribe confirmation: from here on no send is missed
                since = f"{await self.now_ms()}-0"
                last: dict[str, str] = {}
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is None:
                        await pubsub.ping()
                        continue
                    target = str(message.get("data"))
                    if agent is not None and target != agent:
                        continue
                    start = last.get(target, since)
                    for envelope in await self._peek(target, start, PAGE):
                        ms, seq, _ = decode_envelope_id(envelope.envelope_id)
                        last[target] = f"({ms}-{seq}"
                        yield envelope
        except (RedisError, OSError) as exc:
            raise BackendUnavailable(f"lost the subscription to {channel} ({exc}); run it again") from exc
        finally:
            await client.aclose()


def overview(i: AgentInspection) -> AgentOverview:
    return AgentOverview(
        agent=i.agent,
        registered=i.registered,
        provider=i.provider,
        endpoint=i.endpoint,
        tier=Tier.from_label(i.tier) if i.tier in _LABELS else None,
        session=i.session,
        inbox_depth=i.inbox_depth,
        pending=i.pending,
        oldest_unacked_ms=None if i.oldest_unacked_entry is None else entry_ms(i.oldest_unacked_entry),
        dead_letters=i.dead_letters,
        last_seen_ms=i.last_seen_ms,
        ended_at_ms=i.ended_at_ms,
    )


_LABELS = frozenset(t.label for t in Tier)
