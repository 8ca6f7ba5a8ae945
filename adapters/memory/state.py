"""The shared state of the memory backend: registrations and inboxes of one process.

Several ``Relay`` instances may share one ``MemoryState`` (like workers sharing one Redis). Everything
runs on one event loop, so each operation is atomic between awaits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from broker.delivery import DeadLetter
from broker.envelope import Tier, now_ms
from broker.errors import (
    AgentRetired,
    SessionNotRegistered,
    SessionSuperseded,
    TooManyWaits,
    UnregisteredAgent,
)
from broker.history import entry_bytes
from broker.ids import encode_envelope_id
from broker.limits import (
    DEFAULT_HISTORY_RETENTION_MS,
    DEFAULT_IDEMPOTENCY_WINDOW_MS,
    DEFAULT_STATUS_RETENTION_MS,
)
from broker.policy import ContactPolicy
from broker.ports import Appended, Archived, Registration, StoredEnvelope


@dataclass(slots=True)
class MemoryEntry:
    position: tuple[int, int]
    nonce: str
    sender: str
    tier: Tier
    sent_at_ms: int
    fields: dict[str, str]
    deliveries: int = 0
    expires_at_ms: int | None = None
    requeued_from: tuple[str, ...] = ()

    @property
    def envelope_id(self) -> str:
        return encode_envelope_id(*self.position, self.nonce)

    def stored(self, agent: str, *, first_delivery: bool = False) -> StoredEnvelope:
        """This entry of ``agent``'s inbox as the ports hand it out."""
        return StoredEnvelope(
            envelope_id=self.envelope_id,
            sender=self.sender,
            to=agent,
            tier=self.tier,
            sent_at_ms=self.sent_at_ms,
            fields=dict(self.fields),
            deliveries=self.deliveries,
            first_delivery=first_delivery,
            expires_at_ms=self.expires_at_ms,
            requeued_from=self.requeued_from,
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an envelope left its inbox, for its sender's status (Redis keeps the same in its outcome
    records): at which position, after how many deliveries, and how."""

    position: tuple[int, int]
    attempts: int
    state: str
    """``acknowledged``, ``dead_lettered``, ``expired``, ``purged`` or ``requeued``."""
    reason: str | None = None
    requeued_as: tuple[tuple[int, int], str] | None = None
    """Position and nonce of the entry a requeued dead letter became."""


@dataclass(slots=True)
class MemoryInbox:
    entries: dict[tuple[int, int], MemoryEntry] = field(default_factory=dict)
    last: tuple[int, int] = (0, 0)
    arrived: asyncio.Condition | None = None

    def condition(self) -> asyncio.Condition:
        if self.arrived is None:
            self.arrived = asyncio.Condition()
        return self.arrived

    def unacknowledged(self) -> int:
        return len(self.entries)

    async def wake(self) -> None:
        """Wake every waiter on this inbox, to look again."""
        if self.arrived is not None:
            async with self.arrived:
                self.arrived.notify_all()


PRUNE_EVERY = 4096


@dataclass(slots=True)
class MemoryState:
    registrations: dict[str, Registration] = field(default_factory=dict)
    inboxes: dict[str, MemoryInbox] = field(default_factory=dict)
    superseded: dict[str, list[str]] = field(default_factory=dict)
    """Per agent, the sessions its registration replaced, newest first (``SUPERSEDED_SESSIONS_KEPT``)."""
    inbox_cap: int = 0
    """Unacknowledged envelopes an inbox may hold; 0 means no cap (as ``RedisSettings.inbox_cap``)."""
    send_rate: float = 0.0
    send_burst: int = 0
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per-sender token bucket: (tokens, monotonic time of the last refill)."""
    max_waits_per_agent: int = 16
    """Parked fetches (and claims) one agent may have at once."""
    max_waits: int = 10_000
    """Parked fetches (and claims) of all agents together."""
    parked: dict[str, int] = field(default_factory=dict)
    """Parked fetches and claims now, per agent."""
    webhook_secrets: dict[str, str] = field(default_factory=dict)
    """The webhook secret issued for each agent's current registration (dropped by the next one)."""
    webhook_claims: dict[str, tuple[str, float]] = field(default_factory=dict)
    """The notifier of each agent: holder and monotonic deadline."""
    seen: dict[str, int] = field(default_factory=dict)
    """Per agent, its last sign (``broker.presence``; ms)."""
    ended: dict[str, int] = field(default_factory=dict)
    """Per agent, when its registered session said it ended (``leave``; ms)."""
    retired: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    """Per retired agent: when, and the sessions it had then (refused with ``AgentRetired``)."""
    policies: dict[str, ContactPolicy] = field(default_factory=dict)
    """Per recipient, its contact policy when one was set (``adapters/memory/policy.py``)."""
    followers: set[asyncio.Queue[tuple[str, MemoryEntry]]] = field(default_factory=set)
    """Queues of ``MemoryOperatorView.follow`` calls: every appended entry, with its inbox's agent."""

    def registration(self, agent: str) -> Registration | None:
        """``agent``'s registration with its last-seen time and replaced sessions, or None."""
        found = self.registrations.get(agent)
        if found is None:
            return None
        seen = self.seen.get(agent)
        return replace(
            found,
            last_seen_ms=seen,
            superseded=tuple(self.superseded.get(agent, ())),
            ended_at_ms=self.ended.get(agent),
        )

    def caller(self, agent: str, session: str | None) -> Registration:
        """``agent``'s registration when ``session`` may act for it (None = do not check): the one
        session check of the memory stores (as ``lua/_session.lua``)."""
        registration = self.registrations.get(agent)
        if registration is None:
            self.check_retired(agent, session)
            raise UnregisteredAgent(agent)
        if session is not None and registration.session != session:
            if session in self.superseded.get(agent, ()):
                raise SessionSuperseded(agent, session)
            raise SessionNotRegistered(agent, session)
        return registration

    def check_retired(self, agent: str, session: str | None) -> None:
        """``AgentRetired`` when ``agent`` was retired and ``session`` is one it had then (None: any),
        as ``session_refusal`` in ``lua/_session.lua``."""
        retired = self.retired.get(agent)
        if retired is not None and (session is None or session in retired[1]):
            raise AgentRetired(agent)

    def purge(self, agent: str) -> int:
        """Drop every envelope of ``agent``'s inbox, each recorded ``purged`` for its sender's status
        (as ``lua/purge.lua``)."""
        inbox = self.inboxes.get(agent)
        if inbox is None:
            return 0
        dropped = list(inbox.entries.values())
        for entry in dropped:
            self.left(agent, entry.nonce, Outcome(entry.position, entry.deliveries, "purged"))
        inbox.entries.clear()
        return len(dropped)

    def appended(self, agent: str, entry: MemoryEntry) -> None:
        for queue in self.followers:
            queue.put_nowait((agent, entry))

    clock: Callable[[], int] = now_ms
    """Milliseconds since the epoch: expiry is judged by it (as ``RedisInboxStore``'s clock)."""
    max_deliveries: int = 0
    """Hand-outs by fetch before an unacknowledged envelope is dead-lettered; 0 = no limit."""
    idempotency_window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS
    status_retention_ms: int = DEFAULT_STATUS_RETENTION_MS
    """0 = keep no status."""
    dead: dict[str, list[DeadLetter]] = field(default_factory=dict)
    """Dead letters per agent, oldest first."""
    claims: dict[tuple[str, str], tuple[str, int, Appended | None]] = field(default_factory=dict)
    """(sender, idempotency key) -> (request hash, expires at ms, the first send's result)."""
    sent: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    """Status index: sender -> nonce -> (recipient, sent_at ms)."""
    outcomes: dict[str, dict[str, Outcome]] = field(default_factory=dict)
    """Recipient -> nonce -> how each envelope left its inbox."""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Agent -> reason -> envelopes of its inbox dead-lettered at fetch (expired, max_deliveries)."""

    appends: int = 0
    """Sends so far; every ``PRUNE_EVERY`` of them, expired claims and status are dropped."""

    def prune(self) -> None:
        """Forget idempotency claims past their window and status older than the retention (Redis
        expires its keys; here they would otherwise grow with every send)."""
        now = self.clock()
        self.claims = {k: v for k, v in self.claims.items() if v[1] > now}
        oldest = now - self.status_retention_ms
        for sender, noted in list(self.sent.items()):
            kept = {nonce: v for nonce, v in noted.items() if v[1] >= oldest}
            if kept:
                self.sent[sender] = kept
            else:
                del self.sent[sender]
        for agent, outcomes in list(self.outcomes.items()):
            left = {nonce: o for nonce, o in outcomes.items() if o.position[0] >= oldest}
            if left:
                self.outcomes[agent] = left
            else:
                del self.outcomes[agent]

    def left(self, agent: str, nonce: str, outcome: Outcome) -> None:
        """Record how the envelope with ``nonce`` left ``agent``'s inbox, for its sender's status."""
        if self.status_retention_ms > 0:
            self.outcomes.setdefault(agent, {})[nonce] = outcome

    history_retention_ms: int = DEFAULT_HISTORY_RETENTION_MS
    """0 = keep no history."""
    history_max_bytes: int = 0
    """Field bytes one agent's history keeps at most (``broker.history.entry_bytes``); 0 = no cap."""
    history: dict[str, deque[Archived]] = field(default_factory=dict)
    """Per agent, what left its inbox (acknowledged, dead-lettered, expired), oldest first."""
    history_bytes: dict[str, int] = field(default_factory=dict)
    """Per agent, the ``entry_bytes`` of its history together (for ``history_max_bytes``)."""

    def archive(
        self, agent: str, entry: MemoryEntry, attempts: int, outcome: str, reason: str | None
    ) -> None:
        """Keep ``entry`` (just taken out of ``agent``'s inbox) in its history, trimming what is older
        than the retention (as ``entry_archive`` in ``lua/_entry.lua``)."""
        if self.history_retention_ms <= 0:
            return
        now = self.clock()
        kept = self.history.setdefault(agent, deque())
        total = self.history_bytes.get(agent, 0)
        while kept and kept[0].archived_at_ms < now - self.history_retention_ms:
            total -= entry_bytes(kept.popleft())
        seq = 0
        if kept and kept[-1].archived_at_ms == now:
            seq = int(kept[-1].cursor.partition("-")[2]) + 1
        envelope = replace(entry.stored(agent), deliveries=attempts)
        kept.append(Archived(envelope, outcome, reason, now, f"{now}-{seq}"))
        total += entry_bytes(kept[-1])
        while self.history_max_bytes > 0 and len(kept) > 1 and total > self.history_max_bytes:
            total -= entry_bytes(kept.popleft())
        self.history_bytes[agent] = total

    def bury(self, agent: str, entry: MemoryEntry, attempts: int, reason: str) -> None:
        """Move ``entry`` (already taken out of ``agent``'s inbox) to its dead letters, and record the
        outcome for its sender's status."""
        letter = DeadLetter(
            envelope_id=entry.envelope_id,
            sender=entry.sender,
            to=agent,
            tier=entry.tier,
            sent_at_ms=entry.sent_at_ms,
            fields=dict(entry.fields),
            attempts=attempts,
            reason=reason,
            dead_at_ms=self.clock(),
            requeued_from=entry.requeued_from,
        )
        self.dead.setdefault(agent, []).append(letter)
        how = "expired" if reason == "expired" else "dead_lettered"
        self.archive(agent, entry, attempts, how, None if how == "expired" else reason)
        self.left(agent, entry.nonce, Outcome(entry.position, attempts, how, reason[:120]))

    notices: dict[str, tuple[str, tuple[int, int], float]] = field(default_factory=dict)
    """Per agent: the session of its mail-pending cursor, the newest position announced to it, and the
    monotonic time of its last notice (``adapters/memory/notice.py``)."""

    def park(self, agent: str) -> None:
        """Count one more parked waiter of ``agent``; raises ``TooManyWaits`` over a cap."""
        mine = self.parked.get(agent, 0)
        if mine >= self.max_waits_per_agent:
            raise TooManyWaits(agent, self.max_waits_per_agent)
        if sum(self.parked.values()) >= self.max_waits:
            raise TooManyWaits(agent, self.max_waits, per_agent=False)
        self.parked[agent] = mine + 1

    def unpark(self, agent: str) -> None:
        left = self.parked.get(agent, 1) - 1
        if left > 0:
            self.parked[agent] = left
        else:
            self.parked.pop(agent, None)

    async def wake_all(self) -> None:
        """Wake the waiters on every inbox (a store or queue closing: they stop waiting)."""
        for inbox in self.inboxes.values():
            await inbox.wake()


class MemoryStore:
    """What every store on a ``MemoryState`` shares: opening, and closing (which answers every parked
    wait of the state at once)."""

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

    @property
    def backend(self) -> MemoryStore:
        """Each memory store opens and closes itself (several relays on one state each own theirs)."""
        return self
