"""``MemoryDeliveryQueue``: claim-based delivery on the memory backend's inboxes (``IDeliveryQueue``).

Who holds which entry and since when is kept here, keyed by (agent, inbox position), beside the
shared ``MemoryState``; the delivery count is the entry's own ``deliveries`` (shared with the MCP
fetch path, like the Redis PEL count). Receive loops in one process that share a ``MemoryState`` must
share one ``MemoryDeliveryQueue`` too, as workers sharing a Redis share its pending list.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from adapters.memory.inbox import MemoryInboxStore
from adapters.memory.state import MemoryEntry, MemoryInbox, MemoryState, MemoryStore, Outcome
from broker.delivery import DeadLetter
from broker.envelope import now_ms
from broker.errors import UnregisteredAgent
from broker.ids import decode_envelope_id, is_envelope_id, new_nonce
from broker.limits import REQUEUE_LINEAGE
from broker.ports import AckOutcome, StoredEnvelope

_Key = tuple[str, tuple[int, int]]


@dataclass(slots=True)
class _Hold:
    consumer: str
    since: float
    """``time.monotonic()`` of the last hand-out or touch: the idle clock."""


@dataclass(slots=True)
class _Shared:
    holds: dict[_Key, _Hold] = field(default_factory=dict)


class MemoryDeliveryQueue(MemoryStore):
    def __init__(self, state: MemoryState) -> None:
        super().__init__(state)
        self._inbox = MemoryInboxStore(state)
        self._shared = _Shared()

    def _inbox_of(self, agent: str) -> MemoryInbox:
        if agent not in self.state.registrations:
            raise UnregisteredAgent(agent)
        return self.state.inboxes.setdefault(agent, MemoryInbox())

    def _entry(self, agent: str, envelope_id: str) -> MemoryEntry | None:
        if not is_envelope_id(envelope_id):
            return None
        ms, seq, nonce = decode_envelope_id(envelope_id)
        inbox = self.state.inboxes.get(agent)
        entry = inbox.entries.get((ms, seq)) if inbox is not None else None
        return entry if entry is not None and entry.nonce == nonce else None

    def _held_by(self, agent: str, envelope_id: str, consumer: str) -> MemoryEntry | None:
        entry = self._entry(agent, envelope_id)
        if entry is None:
            return None
        hold = self._shared.holds.get((agent, entry.position))
        return entry if hold is not None and hold.consumer == consumer else None

    def _forget_gone(self, agent: str, inbox: MemoryInbox) -> None:
        # entries acknowledged through the inbox store leave their hold behind; drop it here
        for key in [k for k in self._shared.holds if k[0] == agent and k[1] not in inbox.entries]:
            del self._shared.holds[key]

    async def claim(
        self,
        agent: str,
        consumer: str,
        limit: int,
        *,
        visibility: float,
        wait: float | None = None,
    ) -> list[StoredEnvelope]:
        inbox = self._inbox_of(agent)
        self._forget_gone(agent, inbox)
        now = time.monotonic()
        out: list[StoredEnvelope] = []
        for entry in list(inbox.entries.values()):
            if len(out) >= limit:
                break
            if entry.deliveries == 0:
                continue
            key = (agent, entry.position)
            hold = self._shared.holds.get(key)
            if hold is None:
                # handed out by the MCP fetch path, which records no time: start its idle clock now
                self._shared.holds[key] = _Hold(agent, now)
                continue
            if now - hold.since >= visibility:
                self._shared.holds[key] = _Hold(consumer, now)
                entry.deliveries += 1
                out.append(entry.stored(agent, first_delivery=False))
        out.extend(self._take_new(agent, inbox, consumer, limit - len(out)))
        if out or not wait or self._closed:
            return out
        self.state.park(agent)
        try:
            condition = inbox.condition()
            async with condition:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        condition.wait_for(
                            lambda: self._closed or any(e.deliveries == 0 for e in inbox.entries.values())
                        ),
                        wait,
                    )
        finally:
            self.state.unpark(agent)
        return self._take_new(agent, inbox, consumer, limit)

    def _take_new(self, agent: str, inbox: MemoryInbox, consumer: str, count: int) -> list[StoredEnvelope]:
        out: list[StoredEnvelope] = []
        now = time.monotonic()
        for entry in list(inbox.entries.values()):
            if len(out) >= count:
                break
            if entry.deliveries == 0:
                entry.deliveries = 1
                self._shared.holds[(agent, entry.position)] = _Hold(consumer, now)
                out.append(entry.stored(agent, first_delivery=True))
        return out

    async def retry(self, agent: str, consumer: str, envelope_id: str) -> int:
        entry = self._held_by(agent, envelope_id, consumer)
        if entry is None:
            return 0
        entry.deliveries += 1
        self._shared.holds[(agent, entry.position)] = _Hold(consumer, time.monotonic())
        return entry.deliveries

    async def touch(self, agent: str, consumer: str, ids: Sequence[str]) -> list[str]:
        now = time.monotonic()
        kept: list[str] = []
        for envelope_id in ids:
            entry = self._held_by(agent, envelope_id, consumer)
            if entry is not None:
                self._shared.holds[(agent, entry.position)] = _Hold(consumer, now)
                kept.append(envelope_id)
        return kept

    async def ack(self, agent: str, ids: Sequence[str]) -> AckOutcome:
        outcome = await self._inbox.ack(agent, ids)
        for envelope_id in outcome.acknowledged:
            ms, seq, _ = decode_envelope_id(envelope_id)
            self._shared.holds.pop((agent, (ms, seq)), None)
        return outcome

    async def dead_letter(
        self, agent: str, envelope_id: str, reason: str, *, consumer: str | None = None
    ) -> bool:
        entry = self._entry(agent, envelope_id)
        if entry is None or entry.deliveries == 0:
            return False
        key = (agent, entry.position)
        hold = self._shared.holds.get(key)
        if consumer is not None and (hold is None or hold.consumer != consumer):
            return False
        del self.state.inboxes[agent].entries[entry.position]
        self._shared.holds.pop(key, None)
        self.state.bury(agent, entry, entry.deliveries, reason)
        return True

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]:
        return list(self.state.dead.get(agent, [])[:limit])

    async def dead_letter_count(self, agent: str) -> int:
        return len(self.state.dead.get(agent, []))

    async def requeue(self, agent: str, ids: Sequence[str] | None = None) -> list[str]:
        dead = self.state.dead.get(agent, [])
        wanted = None if ids is None else set(ids)
        chosen = [d for d in dead if wanted is None or d.envelope_id in wanted]
        if not chosen:
            return []
        inbox = self.state.inboxes.setdefault(agent, MemoryInbox())
        new_ids: list[str] = []
        for letter in chosen:
            dead.remove(letter)
            ms, seq = inbox.last
            stamp = now_ms()
            position = (stamp, 0) if stamp > ms else (ms, seq + 1)
            inbox.last = position
            entry = MemoryEntry(
                position,
                new_nonce(),
                letter.sender,
                letter.tier,
                letter.sent_at_ms,
                dict(letter.fields),
                requeued_from=(letter.envelope_id, *letter.requeued_from)[:REQUEUE_LINEAGE],
            )
            inbox.entries[position] = entry
            ms, seq, nonce = decode_envelope_id(letter.envelope_id)
            went = Outcome((ms, seq), letter.attempts, "requeued", requeued_as=(position, entry.nonce))
            self.state.left(agent, nonce, went)
            new_ids.append(entry.envelope_id)
        await inbox.wake()
        return new_ids

    async def release(self, agent: str, consumer: str, ids: Sequence[str] = ()) -> None:
        for envelope_id in ids:
            entry = self._held_by(agent, envelope_id, consumer)
            if entry is not None:
                self._shared.holds[(agent, entry.position)] = _Hold(consumer, float("-inf"))
