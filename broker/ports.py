"""The storage ports the relay core is built on.

``IRegistry`` holds registrations; ``IInboxStore`` holds envelopes; ``INoticeStore`` tells an agent that
mail is waiting, without touching the inbox. A store is paired with the registry
of the same backend (same Redis, same memory state): ``fetch``/``ack`` check the caller's registration
atomically with what they read or write, and ``append`` checks the recipient's atomically with the
append, so a send never lands in an inbox whose owner is not registered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol

from broker.addresses import Address
from broker.credentials import Credential, CredentialEvent
from broker.envelope import Tier, from_ms
from broker.errors import SessionNotRegistered, SessionSuperseded
from broker.policy import ContactPolicy, PolicySummary

SUPERSEDED_SESSIONS_KEPT = 32
"""Replaced sessions a registry remembers per agent, to tell ``SessionSuperseded`` (a replaced session)
from ``SessionNotRegistered`` (a session that never registered); an older one counts as never registered."""


@dataclass(frozen=True, slots=True)
class Registration:
    """Where an agent can be reached, from which session, since when."""

    agent: str
    provider: str
    endpoint: str
    tier: Tier
    session: str
    registered_at_ms: int
    """When the agent first registered (ms since the epoch, like every time inside relay)."""
    updated_at_ms: int
    last_seen_ms: int | None = None
    """The agent's last registration, fetch or acknowledgement (the store's clock); None if unknown."""
    superseded: tuple[str, ...] = ()
    """Sessions this registration replaced, newest first (at most ``SUPERSEDED_SESSIONS_KEPT``)."""
    ended_at_ms: int | None = None
    """When its session said it ended (``IRegistry.leave``; the store's clock); None if it did not."""

    @property
    def registered_at(self) -> datetime:
        return from_ms(self.registered_at_ms)

    @property
    def updated_at(self) -> datetime:
        return from_ms(self.updated_at_ms)

    @property
    def last_seen(self) -> datetime | None:
        return None if self.last_seen_ms is None else from_ms(self.last_seen_ms)

    def check_session(self, session: str) -> None:
        """Raise ``SessionSuperseded`` when ``session`` was replaced by the current one, and
        ``SessionNotRegistered`` when it is neither (the rule the stores apply, for reads that go
        through no store script)."""
        if session == self.session:
            return
        if session in self.superseded:
            raise SessionSuperseded(self.agent, session)
        raise SessionNotRegistered(self.agent, session)


@dataclass(frozen=True, slots=True)
class RegisterOutcome:
    registration: Registration
    created: bool
    """True when the agent had no registration before."""
    superseded_session: str | None
    """The previous session when this registration replaced a different one."""


@dataclass(frozen=True, slots=True)
class Appended:
    """What ``append`` stored: the envelope's id, its tier and the time it was accepted (ms)."""

    envelope_id: str
    tier: Tier
    sent_at_ms: int
    repeated: bool = False
    """True when an idempotency key matched an earlier send: this is its result, nothing was stored."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """The optional parts of a send. ``request_hash`` identifies the request (recipient, body, ttl)
    for the idempotency key; it is set exactly when ``idempotency_key`` is."""

    idempotency_key: str | None = None
    request_hash: str | None = None
    expires_at_ms: int | None = None
    """When the envelope expires (ms since the epoch); None = never."""


@dataclass(frozen=True, slots=True)
class StoredEnvelope:
    """One inbox entry as handed out by ``fetch``; ``fields`` are the contract's body fields."""

    envelope_id: str
    sender: str
    to: str
    tier: Tier
    sent_at_ms: int
    fields: Mapping[str, str]
    deliveries: int
    first_delivery: bool
    """True exactly once per envelope across every process: the fetch that first handed it out."""
    expires_at_ms: int | None = None
    requeued_from: tuple[str, ...] = ()
    """A requeued dead letter's earlier ids, newest first (at most ``REQUEUE_LINEAGE``): replies to
    any of them answer this envelope."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """What ``fetch`` handed out, and what it moved to the dead letters instead: (tier, reason) each,
    the reason ``expired`` or ``max_deliveries``."""

    envelopes: list[StoredEnvelope]
    dead_lettered: tuple[tuple[Tier, str], ...] = ()


STATES: Final = ("queued", "delivered", "acknowledged", "dead_lettered", "expired", "purged", "unknown")
"""What ``status`` says of an envelope (see ``IInboxStore.status``)."""


@dataclass(frozen=True, slots=True)
class MessageStatus:
    """What became of one envelope, as its sender may learn it."""

    envelope_id: str
    state: str
    """One of ``STATES``."""
    to: str | None = None
    deliveries: int | None = None
    """Hand-outs so far; None when not known (acknowledged, unknown)."""
    sent_at_ms: int | None = None
    reason: str | None = None
    """Why it was dead-lettered (``max_deliveries``, a receive loop's reason) or ``expired``."""


@dataclass(frozen=True, slots=True)
class Retired:
    """What ``IRegistry.retire`` did: the sessions that are refused from now on (``AgentRetired``),
    whether the registration ended now (False: it had already been retired), and, with ``purge``, the
    envelopes dropped from the inbox (each ``purged`` in its sender's status)."""

    agent: str
    sessions: tuple[str, ...]
    now: bool
    purged: int = 0


@dataclass(frozen=True, slots=True)
class AckOutcome:
    acknowledged: tuple[str, ...] = ()
    unknown: tuple[str, ...] = field(default=())
    origins: tuple[tuple[str, Tier], ...] = ()
    """Sender and tier of each acknowledged envelope, in the order of ``acknowledged`` (for logs)."""


class IBackend(Protocol):
    """The connection one backend's stores share: the registry, the inbox store and the notice store
    of a ``Relay`` name it as their ``backend``, and ``Relay.start`` opens each distinct one once (one
    owner, however many stores run on it); ``Relay.stop`` closes it."""

    async def open(self) -> None:
        """Prepare connections/scripts. Raises ``BackendUnavailable``."""
        ...

    async def close(self) -> None:
        """Release what ``open`` prepared; a parked fetch or wait on it is answered at once."""
        ...

    async def ping(self) -> bool:
        """True when the backend answers now."""
        ...


class IRegistry(Protocol):
    """Durable agent registrations.

    Semantics every implementation keeps:
    - ``register`` is an upsert keyed by agent id; ``registered_at`` is kept, ``updated_at`` moves.
    - A registration from a new session supersedes the previous session: operations that name the old
      session are refused with ``SessionSuperseded`` (the last ``SUPERSEDED_SESSIONS_KEPT`` replaced
      sessions are remembered), and a parked fetch of the old session wakes and is refused at once.
      Operations naming a session that never registered are refused with ``SessionNotRegistered``.
      The agent's inbox and its queued envelopes are kept across re-registration.
    - Registrations (and queued envelopes) survive a restart of the relay process when the backend is
      durable (Redis); the memory backend lives as long as its process.
    - ``retire`` ends a registration, atomically on the agent's slot: from then on a send to the agent
      raises ``UnknownRecipient`` (a send is either stored before the retirement or refused, never
      stored after it), and the sessions it had (the current one and those it had replaced) get
      ``AgentRetired`` on every operation, registering included; so does an operation naming no
      session. A parked fetch or wait of the agent wakes and is refused. A session it never had may
      register the id again: a fresh registration (``created``), its earlier sessions superseded. Its
      inbox, dead letters and history stay readable to operators (the history until its retention);
      with ``purge`` they are deleted, each envelope of the inbox recorded ``purged`` for its sender's
      status (``IInboxStore.purge``). Retiring again is harmless (with ``purge``, it purges).
    """

    @property
    def backend(self) -> IBackend:
        """What this store runs on; ``Relay`` opens, pings and closes it."""
        ...

    async def register(self, agent: str, address: Address, session: str) -> RegisterOutcome:
        """Create or replace the registration of ``agent`` and make sure its inbox exists.

        Args:
            agent: a checked agent id. address: a parsed provider address. session: a checked session id.
        Raises:
            BackendUnavailable: nothing was written.
        """
        ...

    async def get(self, agent: str) -> Registration | None:
        """The registration of ``agent``, or None. Raises ``BackendUnavailable``."""
        ...

    async def list(self, limit: int = 1000, after: str | None = None) -> list[Registration]:
        """Up to ``limit`` registrations, ordered by agent id; with ``after``, only agents whose id
        sorts after it (the next page). Raises ``BackendUnavailable``."""
        ...

    async def leave(self, agent: str, session: str) -> bool:
        """``session`` says it ended (its process exited): when it is ``agent``'s registered session,
        note when (``Registration.ended_at_ms``, the store's clock) and answer True; its presence is
        ``gone`` until its next sign. Nothing else changes: the registration, its inbox and every
        other session's rights stay. Another session, or none registered, changes nothing (False).
        Raises ``BackendUnavailable``."""
        ...

    async def retire(self, agent: str, *, purge: bool = False) -> Retired:
        """End ``agent``'s registration (see the class); with ``purge`` also delete its inbox (each
        envelope ``purged``), dead letters and history.

        Raises:
            UnregisteredAgent: ``agent`` is neither registered nor retired; nothing was written.
            BackendUnavailable: the registration may or may not have ended (retiring again is safe).
        """
        ...


class IInboxStore(Protocol):
    """Per-agent inboxes with fetch-until-acknowledged semantics.

    - ``fetch`` returns the agent's unacknowledged envelopes oldest first: those already handed out and
      not yet acknowledged, then new ones, up to ``limit``. The same envelopes come back on every fetch,
      from any process sharing the backend, until ``ack``.
    - ``ack`` removes envelopes for good; acknowledging twice or an unknown id is harmless and reported
      as unknown. An agent can only acknowledge envelopes of its own inbox.
    - Acknowledged envelopes leave the inbox at once. With a history retention (the default:
      ``DEFAULT_HISTORY_RETENTION_MS``) the envelope is kept, read-only, in its recipient's history
      (``IOperatorView.history``), written atomically with the acknowledgement; so is every envelope
      moved to the dead letters (reason kept) or expired. Each write to a history trims it by time:
      what left the inbox longer than the retention ago is gone; a retention of 0 keeps nothing.
    - Idempotency: a send with an idempotency key that the same sender used within the dedup window
      returns the first send's result (same id, tier and sent_at, ``repeated``) and stores nothing,
      also when the first attempt's caller never saw its answer; the same key with another request
      (recipient, body or ttl) raises ``IdempotencyConflict``. A refused send does not use its key up.
    - Expiry: an envelope whose ``expires_at_ms`` has passed (by the store's clock) is never handed out:
      ``fetch`` moves it to the recipient's dead letters with reason ``expired``; ``sweep`` does the
      same for the oldest envelopes of an inbox without handing anything out.
    - Poison limit: with ``max_deliveries`` N > 0, a pending envelope that ``fetch`` already handed out
      N times moves to the dead letters with reason ``max_deliveries`` instead of coming back.
    - Status: ``status`` tells a sender what became of envelopes it sent, within the status retention;
      anything else (another agent's envelope, an unknown or older id) is ``unknown``. Every way out of
      an inbox (``ack``, a dead letter, expiry, a requeue) is recorded with the envelope's position, so
      an id naming the sender's own envelope at another position is ``unknown`` too.
    """

    @property
    def backend(self) -> IBackend:
        """What this store runs on; ``Relay`` opens, pings and closes it."""
        ...

    async def append(
        self,
        sender: str,
        to: str,
        fields: Mapping[str, str],
        *,
        sent_at_ms: int,
        sender_session: str | None = None,
        options: SendOptions = SendOptions(),
    ) -> Appended:
        """Check the sender (registration, session, idempotency key, rate) and then, atomically with the
        write, the recipient (idempotency record, registration, contact policy, inbox cap), and store
        one envelope in ``to``'s inbox, with ``options.expires_at_ms``.

        The sender's checks come first and nothing is stored when they fail; the recipient's checks
        are atomic with the append. A send refused by the recipient's checks consumes no rate token.
        The tier is the widest of the sender's and the recipient's registered tiers.
        Raises:
            UnregisteredAgent: the sender is not registered.  SessionSuperseded: ``sender_session`` is
            given and was replaced by the current session.  SessionNotRegistered: ``sender_session``
            never registered.  UnknownRecipient: ``to`` is not registered.  NotAccepted: ``to``'s
            contact policy (``IPolicyStore``) does not accept the sender.
            InboxFull: the inbox holds its cap of unacknowledged envelopes.  IdempotencyConflict: the
            key was used for another request.  BackendUnavailable.
            In every case nothing was stored.
        """
        ...

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> Fetched:
        """Up to ``limit`` unacknowledged envelopes, oldest first, and the ones moved to the dead
        letters on the way (expired, or handed out ``max_deliveries`` times already).

        When none is available and ``wait`` is positive, park up to ``wait`` seconds and return as soon
        as one arrives. A parked fetch holds no store connection of its own: it is woken when
        something may have changed for ``agent`` (a send to it, a requeue, a new registration) and then
        looks again exactly like a new fetch, session check included, so a fetch whose session was
        superseded while it waited raises ``SessionSuperseded`` instead of handing mail out. Closing
        the store answers every parked fetch at once (with what is there, usually nothing).

        Parking is bounded per process: at most ``max_waits_per_agent`` parked fetches for one agent
        and ``max_waits`` in all; one more raises ``TooManyWaits`` at once (it never waits, and never
        makes another agent's fetch fail).
        Raises:
            UnregisteredAgent, SessionSuperseded or SessionNotRegistered (when ``session`` is given),
            TooManyWaits, BackendUnavailable.
        """
        ...

    def parked(self, agent: str | None = None) -> int:
        """Fetches parked in this process now: ``agent``'s, or all of them."""
        ...

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        """Acknowledge envelopes of ``agent``'s inbox by id (ids are checked envelope ids).

        Raises:
            UnregisteredAgent, SessionSuperseded or SessionNotRegistered (when ``session`` is given),
            BackendUnavailable.
        """
        ...

    async def status(
        self, sender: str, ids: Sequence[str], *, session: str | None = None
    ) -> list[MessageStatus]:
        """What became of envelopes ``sender`` sent, one status per id in order (ids are checked).

        ``queued`` (in the inbox, never handed out), ``delivered`` (handed out ``deliveries`` times,
        not acknowledged), ``acknowledged`` (``deliveries``: hand-outs before the acknowledgement),
        ``dead_lettered`` (with ``reason``), ``expired``, ``purged`` (dropped from the inbox by an
        operator: ``purge``, or ``IRegistry.retire`` with ``purge``); an id ``sender`` did not send,
        sent longer than the status retention ago, or with its position changed, is ``unknown`` with no other
        field, so one agent learns nothing about another's envelopes. A dead letter that was requeued
        (``IDeliveryQueue.requeue``) reads what the envelope it became reads, through up to
        ``REQUEUE_LINEAGE`` requeues; the new id is the recipient's, not the sender's (``unknown``).
        Raises:
            UnregisteredAgent, SessionSuperseded or SessionNotRegistered (when ``session`` is given),
            BackendUnavailable.
        """
        ...

    async def sweep(self, agent: str, limit: int) -> list[tuple[Tier, str]]:
        """Move expired envelopes among the ``limit`` oldest of ``agent``'s inbox to its dead letters
        (reason ``expired``); returns (tier, reason) of each. Raises ``BackendUnavailable``."""
        ...

    async def purge(self, agent: str) -> int:
        """Drop every envelope queued in ``agent``'s inbox (handed out or not), registered or retired;
        returns how many. Each is recorded ``purged`` (with its hand-outs so far) for its sender's
        ``status``; none goes to the history or the dead letters. Envelopes sent while the purge runs
        may stay (they arrived after it). An agent without an inbox has none.
        Raises ``BackendUnavailable`` (what was dropped until then stays dropped and recorded).
        """
        ...


@dataclass(frozen=True, slots=True)
class AgentOverview:
    """One agent as an operator sees it. Times are milliseconds of the store's clock."""

    agent: str
    registered: bool
    provider: str | None
    endpoint: str | None
    tier: Tier | None
    session: str | None
    inbox_depth: int
    """Unacknowledged envelopes."""
    pending: int
    """Handed out by a fetch and not yet acknowledged."""
    oldest_unacked_ms: int | None
    """When the oldest unacknowledged envelope was accepted; None when the inbox is empty."""
    dead_letters: int
    last_seen_ms: int | None
    """The agent's last sign (``broker.presence``): registration, fetch, acknowledgement, mail-pending
    wait, webhook taken; None when not known."""
    ended_at_ms: int | None = None
    """When its session said it ended (``IRegistry.leave``); None if it did not."""


HISTORY_OUTCOMES: Final = ("acknowledged", "dead_lettered", "expired")
"""How an envelope in an agent's history left its inbox."""


@dataclass(frozen=True, slots=True)
class Archived:
    """One envelope of an agent's history: the envelope as it was (``deliveries`` = hand-outs before
    it left), how and when it left the inbox."""

    envelope: StoredEnvelope
    outcome: str
    """One of ``HISTORY_OUTCOMES``."""
    reason: str | None
    """Why it was dead-lettered (``max_deliveries``, a receive loop's reason); None otherwise."""
    archived_at_ms: int
    """When it left the inbox (the store's clock): the history is ordered and trimmed by it."""
    cursor: str
    """Its position in the history: ``history(after=cursor)`` continues after it."""


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """What ``IOperatorView.history`` returns of an agent's history: entries archived in
    [``since_ms``, ``until_ms``] (None: unbounded), sent by ``sender``, of ``kind``, whose text holds
    every one of ``words`` (``broker.history.matches``)."""

    since_ms: int | None = None
    until_ms: int | None = None
    sender: str | None = None
    kind: str | None = None
    words: tuple[str, ...] = ()


EVERYTHING: Final = HistoryQuery()
"""The query matching every entry of a history."""


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Matching entries, oldest first, and where to go on: ``next`` is the cursor to pass as ``after``
    for the rest (None: the range was read to its end)."""

    entries: list[Archived]
    next: str | None
    read: int
    """History entries read to answer (the cost: at most the page asked for plus ``HISTORY_SCAN``)."""


@dataclass(frozen=True, slots=True)
class AgentsPage:
    """``IOperatorView.agents``: up to ``limit`` agents by id, and how many are registered in all."""

    agents: list[AgentOverview]
    total: int
    now_ms: int
    """The store's clock when the figures were read (ages are measured against it)."""


class IOperatorView(Protocol):
    """Read-only queries for people (the shell commands and the dashboard), paired with the inbox
    store and registry of the same backend.

    Nothing here changes state: no envelope is handed out, no delivery is counted, nothing is
    acknowledged, and "last seen" does not move. Envelopes come back as ``StoredEnvelope`` with
    ``deliveries`` = times handed out so far (0 = never fetched) and ``first_delivery`` always False.
    - ``agents``: per registered agent the figures of ``AgentOverview``, ordered by id, at most
      ``limit``, those after ``after``; bounded work per agent (never reads every envelope).
    - ``unacknowledged``: an agent's unacknowledged envelopes, oldest first, after the envelope id
      ``after`` (exclusive) when given. An unknown agent has none.
    - ``thread``: the envelopes linked to ``envelope_id`` through ``in_reply_to`` (its ancestors, the
      envelope itself and every reply below them, transitively), ordered by time accepted, among the
      envelopes of every inbox and every history (an acknowledged envelope stays in its thread for
      the history retention); empty when ``envelope_id`` is not stored and no stored envelope answers
      it. A requeued dead letter is named by its old ids too (``StoredEnvelope.requeued_from``): a
      reply to one of them answers it, and its archived earlier self is not shown twice.
    - ``history``: what left ``agent``'s inbox (acknowledged, dead-lettered, expired; see
      ``IInboxStore``), oldest first, matching ``query``, at most ``limit``, after the cursor
      ``after``. It reads at most ``limit`` + ``HISTORY_SCAN`` entries, in the time range only; when
      that bound or ``limit`` stops it, ``HistoryPage.next`` says where to go on. Only ``agent``'s
      own history is read: nothing of another agent's is returned or counted. An unknown agent has
      none.
    - ``follow``: envelopes accepted after the call starts (for ``agent`` only when given), in the
      order each inbox got them, until the iterator is closed.
    Raises ``BackendUnavailable`` when the store cannot be read.
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def now_ms(self) -> int:
        """The store's clock, in milliseconds."""
        ...

    async def agents(self, limit: int = 1000, after: str | None = None) -> AgentsPage: ...

    async def unacknowledged(
        self, agent: str, limit: int = 100, after: str | None = None
    ) -> list[StoredEnvelope]: ...

    async def thread(self, envelope_id: str, limit: int = 1000) -> list[StoredEnvelope]: ...

    async def history(
        self, agent: str, query: HistoryQuery = EVERYTHING, limit: int = 100, after: str | None = None
    ) -> HistoryPage: ...

    def follow(self, agent: str | None = None) -> AsyncIterator[StoredEnvelope]: ...


@dataclass(frozen=True, slots=True)
class Announced:
    """One envelope as a notice lists it: who sent it, when, and its body fields (never delivery state)."""

    envelope_id: str
    sender: str
    tier: Tier
    sent_at_ms: int
    fields: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Notice:
    """The answer to a mail-pending wait.

    ``count`` is how many envelopes this notice announces (0: nothing to say, the wait timed out or was
    answered because the store is closing); ``envelopes`` the oldest of them, at most the ``listed``
    asked for; ``unacknowledged`` how many envelopes the inbox holds in all; ``reminder`` is True when the
    notice repeats mail already announced (nothing new arrived, the reminder interval passed)."""

    count: int = 0
    unacknowledged: int = 0
    reminder: bool = False
    envelopes: tuple[Announced, ...] = ()


NOTICE_MAX_COUNT = 1000
"""Envelopes one notice announces at most; more are announced by the next wait, at once."""


class INoticeStore(Protocol):
    """ "Mail pending" notices: a read-only wait that says when an agent has mail it was not told about.

    Paired with the inbox store and the registry of the same backend. Semantics every implementation
    keeps:

    - A cursor per agent remembers the newest envelope announced, so each envelope is announced once:
      a wait re-armed after a notice does not answer again for the same mail. The cursor is shared by
      every process using the backend and by every reader (``POST /agent/wait``, webhook notifications
      through ``broker.webhooks.announce``), and belongs to the agent's current session: a new session
      (its model was told nothing) starts from the oldest unacknowledged envelope.
    - When nothing new arrived but the inbox still holds unacknowledged envelopes, the wait answers a
      reminder (``reminder=True``, ``count`` = the unacknowledged envelopes, the oldest listed) once
      ``remind_after`` seconds have passed since the agent's last notice of either kind; ``0`` never
      reminds. A reminder is one notice, so reminders come at most once per interval.
    - A notice never acknowledges, never counts a delivery, never claims: what ``IInboxStore.fetch``
      returns (ids, order, ``deliveries``) is exactly what it would be without any wait.
    - The caller's session is checked like a fetch's (one check for every store operation), before
      and after parking: a superseded session's wait raises ``SessionSuperseded``, a session that
      never registered ``SessionNotRegistered``, and neither moves a cursor.
    - A parked wait holds no store connection of its own; it is woken like a parked fetch (a send, a
      requeue, a new registration) and shares the fetches' caps (``max_waits_per_agent`` per agent,
      ``max_waits`` in all; one more raises ``TooManyWaits`` at once). Closing the store answers every
      parked wait at once with an empty notice.
    """

    @property
    def backend(self) -> IBackend:
        """What this store runs on; ``Relay`` opens, pings and closes it."""
        ...

    async def wait(
        self, agent: str, session: str, *, seconds: float, remind_after: float, listed: int, seen: bool = True
    ) -> Notice:
        """Announce what ``agent`` was not told about, parking up to ``seconds`` for it.

        With ``seen`` (the agent's own wait, not a webhook notification's read) each look, the first
        and every one after a wake-up, moves the agent's last seen (``Registration.last_seen_ms``),
        like a fetch: a parked wait keeps its agent ``live`` (``broker.presence``).

        Returns at once when something is to be announced (new envelopes, or a reminder falling due),
        else when it is, else an empty ``Notice`` after ``seconds``. ``listed`` caps ``envelopes``.
        Raises:
            UnregisteredAgent, SessionSuperseded, SessionNotRegistered, TooManyWaits,
            BackendUnavailable; the cursor is unchanged when any is raised.
        """
        ...


class IPolicyStore(Protocol):
    """Contact policies: whom each recipient accepts messages from (``broker.policy``, docs/policy.md).

    Paired with the inbox store of the same backend, which applies the policy on every send. Semantics
    every implementation keeps:

    - An agent that never had a policy set has ``DEFAULT_POLICY`` (``open``). A policy may be set for an
      id that is not registered (yet); it is kept across registrations and survives a restart of the
      relay process when the backend is durable (Redis).
    - ``IInboxStore.append`` checks the recipient's policy atomically with the append, after the
      recipient's registration and before its inbox cap: a send the policy does not accept raises
      ``NotAccepted`` and stores nothing, uses no rate token and does not use its idempotency key up.
      A repeat of an accepted send (same idempotency key) is answered as before, whatever the policy
      says now. Every send is judged by the policy in force when it is appended: once ``set`` returned,
      no later send is judged by the old one.
    - The rule (``ContactPolicy.accepts``): ``open`` accepts every registered sender; ``registered``
      senders with a registration, agents and people (provider ``human``) alike; a list only the ids it
      names, people included. Sending needs a registration in every case (``UnregisteredAgent``
      first), whatever the policy.
    - ``set`` replaces the whole policy at once and answers the one it replaced; a list names
      1..``MAX_POLICY_AGENTS`` checked ids (``broker.policy.listing`` refuses more, before anything is
      written).
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, agent: str) -> ContactPolicy:
        """``agent``'s policy (``DEFAULT_POLICY`` when none was set). Raises ``BackendUnavailable``."""
        ...

    async def set(self, agent: str, policy: ContactPolicy) -> ContactPolicy:
        """Make ``policy`` ``agent``'s (``DEFAULT_POLICY``: back to ``open``) and answer the previous one.

        Raises:
            BackendUnavailable: the store did not answer; the policy may or may not have changed.
        """
        ...

    async def summaries(self, agents: Sequence[str]) -> list[PolicySummary]:
        """Each agent's policy kind and list size, in order, with bounded work per agent (no list is
        read). Raises ``BackendUnavailable``."""
        ...


class ISpentTokens(Protocol):
    """Ids of single-use tokens (dashboard login URLs) that were spent, shared by every process of a
    relay on the same backend and kept across restarts (the memory twin: for the life of its object).

    ``spend`` is the one way to use such a token: the first call for an id records it and answers True;
    every later call for that id, from any process, answers False for at least ``ttl_ms`` milliseconds
    (the caller passes at least the token's remaining life: an id forgotten after that is of a token
    that no longer verifies). Answering True when the id cannot be recorded is never allowed: a store
    that does not answer raises ``BackendUnavailable`` (retryable; the id may or may not be recorded).
    """

    async def spend(self, token_id: str, ttl_ms: int) -> bool: ...


class ICredentials(Protocol):
    """Per-agent credentials (``broker.credentials.Credential``): records keyed by id, kept on their
    agent's slot, and the counts of credential events (``broker.credentials.EVENTS``) across every
    process on the backend.

    ``add`` stores a new record (its id is fresh: an id already stored raises ``ValueError`` and
    changes nothing) and counts ``issued``. ``get`` returns the record of an id, None when there is
    none. ``listed`` returns the records of ``agent`` (every agent's when None), oldest first.
    ``revoke`` marks the record revoked at ``at_ms`` and counts ``revoked`` (a record already revoked
    keeps its first time and is not counted again); it returns the record as stored after the call,
    None for an unknown id. ``used`` sets ``last_used_at_ms`` of a stored record and counts
    ``exchanged`` (an unknown id is ignored). ``count`` adds one to an event (``refused``).
    ``events`` returns every event's count, zeros included. A store that does not answer raises
    ``BackendUnavailable`` (retryable) and no call reports a change it did not make.
    """

    async def add(self, credential: Credential) -> None: ...

    async def get(self, credential_id: str) -> Credential | None: ...

    async def listed(self, agent: str | None = None) -> list[Credential]: ...

    async def revoke(self, credential_id: str, at_ms: int) -> Credential | None: ...

    async def used(self, credential_id: str, at_ms: int) -> None: ...

    async def count(self, event: CredentialEvent) -> None: ...

    async def events(self) -> dict[CredentialEvent, int]: ...
