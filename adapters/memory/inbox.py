"""``MemoryInboxStore``: inboxes in process memory, the reference semantics of ``IInboxStore``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence

from adapters.memory.state import MemoryEntry, MemoryInbox, MemoryState
from broker.envelope import Tier, now_ms, widest
from broker.errors import (
    InboxFull,
    RateLimited,
    SessionNotRegistered,
    SessionSuperseded,
    UnknownRecipient,
    UnregisteredAgent,
)
from broker.ids import decode_envelope_id, encode_envelope_id, new_nonce
from broker.ports import AckOutcome, Appended, Registration, StoredEnvelope


class MemoryInboxStore:
    def __init__(self, state: MemoryState) -> None:
        self.state = state
        self._closed = False

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        await self.state.wake_all()

    async def ping(self) -> bool:
        return not self._closed

    def parked(self, agent: str | None = None) -> int:
        if agent is None:
            return sum(self.state.parked.values())
        return self.state.parked.get(agent, 0)

    def _caller(self, agent: str, session: str | None) -> Registration:
        registration = self.state.registrations.get(agent)
        if registration is None:
            raise UnregisteredAgent(agent)
        if session is not None and registration.session != session:
            if session in self.state.superseded.get(agent, ()):
                raise SessionSuperseded(agent, session)
            raise SessionNotRegistered(agent, session)
        return registration

    async def append(
        self,
        sender: str,
        to: str,
        fields: Mapping[str, str],
        *,
        sent_at_ms: int,
        sender_session: str | None = None,
    ) -> Appended:
        origin = self._caller(sender, sender_session)
        target = self.state.registrations.get(to)
        if target is None:
            raise UnknownRecipient(to)
        inbox = self.state.inboxes.setdefault(to, MemoryInbox())
        cap = self.state.inbox_cap
        if cap and (depth := inbox.unacknowledged()) >= cap:
            raise InboxFull(to, cap, depth)
        self._take_token(sender)
        ms, seq = inbox.last
        position = (sent_at_ms, 0) if sent_at_ms > ms else (ms, seq + 1)
        inbox.last = position
        tier = widest(origin.tier, target.tier)
        entry = MemoryEntry(position, new_nonce(), sender, tier, sent_at_ms, dict(fields))
        inbox.entries[position] = entry
        self.state.appended(to, entry)
        await inbox.wake()
        return Appended(encode_envelope_id(*position, entry.nonce), tier, sent_at_ms)

    def _take_token(self, sender: str) -> None:
        rate = self.state.send_rate
        if rate <= 0:
            return
        burst = max(self.state.send_burst, 1)
        now = time.monotonic()
        tokens, last = self.state.buckets.get(sender, (float(burst), now))
        tokens = min(burst, tokens + (now - last) * rate)
        if tokens < 1:
            raise RateLimited(sender, (1 - tokens) / rate)
        self.state.buckets[sender] = (tokens - 1, now)

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> list[StoredEnvelope]:
        self._caller(agent, session)
        self.state.seen[agent] = now_ms()
        inbox = self.state.inboxes.setdefault(agent, MemoryInbox())
        if not inbox.entries and wait and not self._closed:
            self.state.park(agent)
            try:
                condition = inbox.condition()
                async with condition:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            condition.wait_for(lambda: self._look_again(inbox, agent, session)), wait
                        )
            finally:
                self.state.unpark(agent)
            self._caller(agent, session)
        out: list[StoredEnvelope] = []
        for entry in list(inbox.entries.values())[:limit]:
            entry.deliveries += 1
            out.append(
                StoredEnvelope(
                    envelope_id=encode_envelope_id(*entry.position, entry.nonce),
                    sender=entry.sender,
                    to=agent,
                    tier=entry.tier,
                    sent_at_ms=entry.sent_at_ms,
                    fields=dict(entry.fields),
                    deliveries=entry.deliveries,
                    first_delivery=entry.deliveries == 1,
                )
            )
        return out

    def _look_again(self, inbox: MemoryInbox, agent: str, session: str | None) -> bool:
        """Whether a parked fetch wakes: mail arrived, the store closes, or its session was replaced."""
        if inbox.entries or self._closed:
            return True
        registration = self.state.registrations.get(agent)
        return session is not None and (registration is None or registration.session != session)

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        self._caller(agent, session)
        self.state.seen[agent] = now_ms()
        inbox = self.state.inboxes.get(agent)
        acknowledged: list[str] = []
        origins: list[tuple[str, Tier]] = []
        unknown: list[str] = []
        for envelope_id in ids:
            ms, seq, nonce = decode_envelope_id(envelope_id)
            entry = inbox.entries.get((ms, seq)) if inbox is not None else None
            if inbox is not None and entry is not None and entry.nonce == nonce and entry.deliveries > 0:
                del inbox.entries[(ms, seq)]
                acknowledged.append(envelope_id)
                origins.append((entry.sender, entry.tier))
            else:
                unknown.append(envelope_id)
        return AckOutcome(tuple(acknowledged), tuple(unknown), tuple(origins))
