"""``MemoryOperatorView``: the read-only operator queries of ``broker.ports.IOperatorView`` over a
``MemoryState``, the reference semantics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from adapters.memory.state import MemoryEntry, MemoryState
from broker.envelope import now_ms
from broker.history import check_cursor, page
from broker.ids import decode_envelope_id
from broker.ports import EVERYTHING, AgentOverview, AgentsPage, HistoryPage, HistoryQuery, StoredEnvelope
from broker.threads import linked


class MemoryOperatorView:
    def __init__(self, state: MemoryState) -> None:
        self.state = state

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def now_ms(self) -> int:
        return now_ms()

    async def agents(self, limit: int = 1000, after: str | None = None) -> AgentsPage:
        everyone = sorted(self.state.registrations)
        chosen = [a for a in everyone if after is None or a > after][:limit]
        return AgentsPage([self._overview(a) for a in chosen], len(everyone), now_ms())

    def _overview(self, agent: str) -> AgentOverview:
        registration = self.state.registrations[agent]
        inbox = self.state.inboxes.get(agent)
        entries = list(inbox.entries.values()) if inbox is not None else []
        return AgentOverview(
            agent=agent,
            registered=True,
            provider=registration.provider,
            endpoint=registration.endpoint,
            tier=registration.tier,
            session=registration.session,
            inbox_depth=len(entries),
            pending=sum(1 for e in entries if e.deliveries > 0),
            oldest_unacked_ms=min((e.position[0] for e in entries), default=None),
            dead_letters=0,  # dead letters belong to the messenger's delivery queue, not to this state
            last_seen_ms=self.state.seen.get(agent),
            ended_at_ms=self.state.ended.get(agent),
        )

    async def unacknowledged(
        self, agent: str, limit: int = 100, after: str | None = None
    ) -> list[StoredEnvelope]:
        inbox = self.state.inboxes.get(agent)
        if inbox is None:
            return []
        start = (0, -1)
        if after is not None:
            ms, seq, _ = decode_envelope_id(after)
            start = (ms, seq)
        chosen = sorted(p for p in inbox.entries if p > start)[:limit]
        return [inbox.entries[p].stored(agent) for p in chosen]

    async def thread(self, envelope_id: str, limit: int = 1000) -> list[StoredEnvelope]:
        everything = [
            entry.stored(agent)
            for agent, inbox in self.state.inboxes.items()
            for entry in inbox.entries.values()
        ]
        everything += [a.envelope for kept in self.state.history.values() for a in kept]
        return linked(envelope_id, everything, limit)

    async def history(
        self, agent: str, query: HistoryQuery = EVERYTHING, limit: int = 100, after: str | None = None
    ) -> HistoryPage:
        since, until = query.since_ms or 0, query.until_ms
        position = _position(check_cursor(after)) if after is not None else (-1, -1)
        chosen = (
            a
            for a in self.state.history.get(agent, [])
            if a.archived_at_ms >= since
            and (until is None or a.archived_at_ms <= until)
            and _position(a.cursor) > position
        )
        return page(chosen, query, limit)

    async def follow(self, agent: str | None = None) -> AsyncIterator[StoredEnvelope]:
        queue: asyncio.Queue[tuple[str, MemoryEntry]] = asyncio.Queue()
        self.state.followers.add(queue)
        try:
            while True:
                to, entry = await queue.get()
                if agent is None or to == agent:
                    yield entry.stored(to)
        finally:
            self.state.followers.discard(queue)


def _position(cursor: str) -> tuple[int, int]:
    ms, _, seq = cursor.partition("-")
    return int(ms), int(seq)
