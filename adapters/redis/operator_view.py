"""``RedisOperatorView``: the read-only operator queries of ``broker.ports.IOperatorView`` on Redis.

- ``agents``: the registrations found by the directory scan, then one read-only ``inspect.lua`` call
  per agent (registration hash, ``XLEN``, the ``XPENDING`` summary, the oldest entry id, dead-letter
  ``XLEN``), auto-pipelined per node by ``Inspector``: never reads an envelope.
- ``unacknowledged``: ``peek.lua`` (``XRANGE`` plus the ``XPENDING`` counts of the same range), which
  neither reads through the consumer group nor counts a delivery.
- ``thread``: pages of ``peek.lua`` over every inbox (in pipelined rounds), linked by ``in_reply_to``.
- ``follow``: a ``SUBSCRIBE`` to the wake-up channel (every send publishes the recipient's id), and an
  ``XRANGE`` of that inbox after the last entry shown: a read, never a fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import entry_ms, rows
from adapters.redis.inspect import AgentInspection, Inspector
from adapters.redis.protocol_operator import peek_call
from adapters.redis.wake import subscriber_client
from broker.envelope import Tier
from broker.errors import BackendUnavailable
from broker.ids import decode_envelope_id
from broker.ports import AgentOverview, AgentsPage, StoredEnvelope
from broker.threads import linked

PAGE = 1000
"""Entries one ``peek.lua`` call returns at most while walking every inbox."""
PIPELINE_CHUNK = 200
"""Inboxes read at once while walking every inbox."""


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
        return linked(envelope_id, await self._everything(), limit)

    async def _everything(self) -> list[StoredEnvelope]:
        """Every stored envelope of every inbox (for ``thread``: an occasional query, not a hot one)."""
        agents = await self.inspector.directory.agents()
        found: list[StoredEnvelope] = []
        for begin in range(0, len(agents), PIPELINE_CHUNK):
            todo = {a: "-" for a in agents[begin : begin + PIPELINE_CHUNK]}
            while todo:
                names = list(todo)
                pages = await asyncio.gather(*(self._peek(a, todo[a], PAGE) for a in names))
                for agent, page in zip(names, pages, strict=True):
                    found.extend(page)
                    if len(page) < PAGE:
                        del todo[agent]
                    else:
                        ms, seq, _ = decode_envelope_id(page[-1].envelope_id)
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
    )


_LABELS = frozenset(t.label for t in Tier)
