"""``MemoryInboxStore``: inboxes in process memory, the reference semantics of ``IInboxStore``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Final

from adapters.memory.state import PRUNE_EVERY, MemoryEntry, MemoryInbox, MemoryStore, Outcome
from broker.envelope import Tier, now_ms, widest
from broker.errors import (
    IdempotencyConflict,
    InboxFull,
    NotAccepted,
    RateLimited,
    UnknownRecipient,
)
from broker.ids import decode_envelope_id, encode_envelope_id, new_nonce
from broker.limits import REQUEUE_LINEAGE
from broker.ports import (
    AckOutcome,
    Appended,
    Fetched,
    MessageStatus,
    SendOptions,
    StoredEnvelope,
)

_NO_OPTIONS: Final = SendOptions()


class MemoryInboxStore(MemoryStore):
    def parked(self, agent: str | None = None) -> int:
        if agent is None:
            return sum(self.state.parked.values())
        return self.state.parked.get(agent, 0)

    async def append(
        self,
        sender: str,
        to: str,
        fields: Mapping[str, str],
        *,
        sent_at_ms: int,
        sender_session: str | None = None,
        options: SendOptions = _NO_OPTIONS,
    ) -> Appended:
        origin = self.state.caller(sender, sender_session)
        state = self.state
        claim = None
        if options.idempotency_key is not None:
            claim = (sender, options.idempotency_key)
            held = state.claims.get(claim)
            if held is not None and held[1] > state.clock():
                request, _, first = held
                if request != options.request_hash:
                    raise IdempotencyConflict(sender, options.idempotency_key)
                if first is not None:
                    return Appended(first.envelope_id, first.tier, first.sent_at_ms, repeated=True)
        target = self.state.registrations.get(to)
        if target is None:
            raise UnknownRecipient(to)
        tier = widest(origin.tier, target.tier)
        policy = state.policies.get(to)
        if policy is not None and not policy.accepts(sender, origin.provider):
            raise NotAccepted(to, sender, policy.accept_from, tier.label)
        inbox = self.state.inboxes.setdefault(to, MemoryInbox())
        cap = self.state.inbox_cap
        if cap and (depth := inbox.unacknowledged()) >= cap:
            raise InboxFull(to, cap, depth)
        self._take_token(sender)
        ms, seq = inbox.last
        position = (sent_at_ms, 0) if sent_at_ms > ms else (ms, seq + 1)
        inbox.last = position
        entry = MemoryEntry(
            position, new_nonce(), sender, tier, sent_at_ms, dict(fields), expires_at_ms=options.expires_at_ms
        )
        inbox.entries[position] = entry
        appended = Appended(encode_envelope_id(*position, entry.nonce), tier, sent_at_ms)
        if claim is not None and options.request_hash is not None:
            until = state.clock() + state.idempotency_window_ms
            state.claims[claim] = (options.request_hash, until, appended)
        if state.status_retention_ms > 0:
            state.sent.setdefault(sender, {})[entry.nonce] = (to, sent_at_ms)
        state.appends += 1
        if state.appends % PRUNE_EVERY == 0:
            state.prune()
        self.state.appended(to, entry)
        await inbox.wake()
        return appended

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
    ) -> Fetched:
        self.state.caller(agent, session)
        self.state.seen[agent] = now_ms()
        inbox = self.state.inboxes.setdefault(agent, MemoryInbox())
        dropped = self._drop(agent, inbox)
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
            self.state.caller(agent, session)
            dropped += self._drop(agent, inbox)
        out: list[StoredEnvelope] = []
        for entry in list(inbox.entries.values())[:limit]:
            entry.deliveries += 1
            out.append(entry.stored(agent, first_delivery=entry.deliveries == 1))
        return Fetched(out, tuple(dropped))

    def _drop(self, agent: str, inbox: MemoryInbox, limit: int | None = None) -> list[tuple[Tier, str]]:
        """Move expired entries, and entries handed out ``max_deliveries`` times, to the dead letters
        (the oldest ``limit`` only, when given: a sweep)."""
        state = self.state
        now, most = state.clock(), state.max_deliveries if limit is None else 0
        dropped: list[tuple[Tier, str]] = []
        for entry in list(inbox.entries.values())[:limit]:
            if entry.expires_at_ms is not None and entry.expires_at_ms <= now:
                reason = "expired"
            elif most and entry.deliveries >= most:
                reason = "max_deliveries"
            else:
                continue
            del inbox.entries[entry.position]
            state.bury(agent, entry, entry.deliveries, reason)
            counts = state.counts.setdefault(agent, {})
            counts[reason] = counts.get(reason, 0) + 1
            dropped.append((entry.tier, reason))
        return dropped

    async def purge(self, agent: str) -> int:
        return self.state.purge(agent)

    async def sweep(self, agent: str, limit: int) -> list[tuple[Tier, str]]:
        inbox = self.state.inboxes.get(agent)
        return self._drop(agent, inbox, limit) if inbox is not None else []

    async def status(
        self, sender: str, ids: Sequence[str], *, session: str | None = None
    ) -> list[MessageStatus]:
        self.state.caller(sender, session)
        state = self.state
        now, retention = state.clock(), state.status_retention_ms
        mine = state.sent.get(sender, {})
        out: list[MessageStatus] = []
        for envelope_id in ids:
            ms, seq, nonce = decode_envelope_id(envelope_id)
            noted = mine.get(nonce)
            if noted is None or retention <= 0 or ms < now - retention:
                out.append(MessageStatus(envelope_id, "unknown"))
                continue
            to, sent_at_ms = noted
            found = self._whereabouts(to, (ms, seq), nonce, now)
            if found is None:
                out.append(MessageStatus(envelope_id, "unknown"))
            else:
                out.append(MessageStatus(envelope_id, found[0], to, found[1], sent_at_ms, found[2]))
        return out

    def _whereabouts(
        self, to: str, position: tuple[int, int], nonce: str, now: int
    ) -> tuple[str, int, str | None] | None:
        """(state, deliveries, reason) of the envelope at ``position`` with ``nonce`` in ``to``'s
        inbox, following requeues (as ``lua/status.lua``); None when it is not known there."""
        inbox = self.state.inboxes.get(to)
        outcomes = self.state.outcomes.get(to, {})
        for _ in range(REQUEUE_LINEAGE + 1):
            entry = inbox.entries.get(position) if inbox is not None else None
            if entry is not None and entry.nonce == nonce:
                if entry.expires_at_ms is not None and entry.expires_at_ms <= now:
                    return "expired", entry.deliveries, "expired"
                return ("delivered" if entry.deliveries else "queued"), entry.deliveries, None
            outcome = outcomes.get(nonce)
            if outcome is None or outcome.position != position:
                return None
            if outcome.requeued_as is None:
                return outcome.state, outcome.attempts, outcome.reason
            position, nonce = outcome.requeued_as
        return None

    def _look_again(self, inbox: MemoryInbox, agent: str, session: str | None) -> bool:
        """Whether a parked fetch wakes: mail arrived, the store closes, or its session was replaced."""
        if inbox.entries or self._closed:
            return True
        registration = self.state.registrations.get(agent)
        return registration is None or (session is not None and registration.session != session)

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        self.state.caller(agent, session)
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
                self.state.left(agent, entry.nonce, Outcome(entry.position, entry.deliveries, "acknowledged"))
                self.state.archive(agent, entry, entry.deliveries, "acknowledged", None)
                acknowledged.append(envelope_id)
                origins.append((entry.sender, entry.tier))
            else:
                unknown.append(envelope_id)
        return AckOutcome(tuple(acknowledged), tuple(unknown), tuple(origins))
