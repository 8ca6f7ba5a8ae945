"""``MemoryNoticeStore``: mail-pending notices in process memory, the reference semantics of
``INoticeStore``. The cursors live in the shared ``MemoryState``, so every relay on it shares them."""

from __future__ import annotations

import asyncio
import contextlib
import time

from adapters.memory.state import MemoryEntry, MemoryInbox, MemoryStore
from broker.envelope import now_ms
from broker.ports import NOTICE_MAX_COUNT, Announced, Notice

_START = (0, 0)
"""Before every inbox position."""


class MemoryNoticeStore(MemoryStore):
    async def wait(
        self, agent: str, session: str, *, seconds: float, remind_after: float, listed: int, seen: bool = True
    ) -> Notice:
        notice, due = self._announce(agent, session, remind_after, listed, seen)
        if notice.count or seconds <= 0 or self._closed:
            return notice
        inbox = self.state.inboxes.setdefault(agent, MemoryInbox())
        deadline = time.monotonic() + seconds
        self.state.park(agent)
        try:
            condition = inbox.condition()
            while True:
                left = deadline - time.monotonic()
                async with condition:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(condition.wait(), left if due is None else min(left, due))
                if self._closed:
                    return Notice(unacknowledged=notice.unacknowledged)
                notice, due = self._announce(agent, session, remind_after, listed, seen)
                if notice.count or time.monotonic() >= deadline:
                    return notice
        finally:
            self.state.unpark(agent)

    def _announce(
        self, agent: str, session: str, remind_after: float, listed: int, seen: bool
    ) -> tuple[Notice, float | None]:
        """As ``lua/notice.lua``: the notice due now, and the seconds until a reminder falls due."""
        self.state.caller(agent, session)
        if seen:
            self.state.seen[agent] = now_ms()
        inbox = self.state.inboxes.get(agent)
        entries = list(inbox.entries.values()) if inbox is not None else []
        now = time.monotonic()
        owner, cursor, at = self.state.notices.get(agent, (session, _START, 0.0))
        if owner != session:
            cursor, at = _START, 0.0
        fresh = [entry for entry in entries if entry.position > cursor][:NOTICE_MAX_COUNT]
        if fresh:
            self.state.notices[agent] = (session, fresh[-1].position, now)
            return Notice(len(fresh), len(entries), False, _listed(fresh, listed)), None
        if not entries or remind_after <= 0:
            return Notice(unacknowledged=len(entries)), None
        due = at + remind_after - now
        if due > 0:
            return Notice(unacknowledged=len(entries)), due
        self.state.notices[agent] = (session, cursor, now)
        count = min(len(entries), NOTICE_MAX_COUNT)
        return Notice(count, len(entries), True, _listed(entries, listed)), None


def _listed(entries: list[MemoryEntry], listed: int) -> tuple[Announced, ...]:
    return tuple(
        Announced(
            envelope_id=entry.envelope_id,
            sender=entry.sender,
            tier=entry.tier,
            sent_at_ms=entry.sent_at_ms,
            fields=dict(entry.fields),
        )
        for entry in entries[:listed]
    )
