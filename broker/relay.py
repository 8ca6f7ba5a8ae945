"""``Relay[Body]``: register, send, fetch and acknowledge on top of the storage ports.

The relay is a runtime service: it owns no listener. Build it, ``start`` it (or ``async with`` it), and
hand it to whatever needs it (the HTTP front, a ``Messenger``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Generic, Self, TypeVar

from prometheus_client import CollectorRegistry

from broker.addresses import Address
from broker.contract import RESERVED_FIELDS, Contract
from broker.envelope import Envelope, Tier, now_ms
from broker.errors import BackendRefused, InvalidArgument, NotAccepted, RelayError, RelayNotRunning
from broker.ids import check_agent_id, check_idempotency_key, check_session_id
from broker.limits import (
    DEFAULT_FETCH_LIMIT,
    DEFAULT_REMIND_AFTER_SECONDS,
    MAX_ACK_IDS,
    MAX_NOTICE_WAIT_SECONDS,
    MAX_STATUS_IDS,
    MAX_TTL_MS,
    MAX_WAIT_SECONDS,
    NOTICE_LISTED,
    SWEEP_BATCH,
    SWEEP_MAX_PAGES,
    SWEEP_PAGE,
    check_envelope_ids,
    check_fetch_limit,
    check_ttl,
    request_hash,
)
from broker.metrics import RelayMetrics
from broker.ports import (
    IBackend,
    IInboxStore,
    INoticeStore,
    IRegistry,
    MessageStatus,
    Notice,
    Registration,
    SendOptions,
)

Body = TypeVar("Body")
_T = TypeVar("_T")

log = logging.getLogger("relay.core")


@dataclass(frozen=True, slots=True)
class Registered:
    """The result of ``register``."""

    registration: Registration
    created: bool
    superseded_session: str | None


@dataclass(frozen=True, slots=True)
class MailNotice(Generic[Body]):
    """The answer of ``wait_for_mail``: see ``broker.ports.Notice``. ``envelopes`` carry
    ``deliveries=0``: a notice is not a delivery."""

    count: int
    unacknowledged: int
    reminder: bool
    envelopes: tuple[Envelope[Body], ...]


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """Which ids were acknowledged now and which were unknown (never delivered, already acked, or
    not this agent's)."""

    acknowledged: tuple[str, ...]
    unknown: tuple[str, ...]
    origins: tuple[tuple[str, Tier], ...] = ()
    """Sender and tier of each acknowledged envelope, in the order of ``acknowledged``."""


class Relay(Generic[Body]):
    """Delivers ``Body`` messages between registered agents.

    Args:
        contract: validates and encodes ``Body``.
        inbox: the inbox store (paired with ``registry``: same backend).
        registry: where registrations live.
        metrics: the Prometheus registry to export ``csf_relay_*`` on;
            a private one when omitted.
        max_wait: the longest a blocking fetch may wait, in seconds; longer waits are capped.
        notices: the mail-pending notice store (same backend); without it ``wait_for_mail`` is refused.
        remind_after: seconds after which unacknowledged mail is announced again; 0 = never.
        max_ttl_ms: the longest ``ttl_ms`` a send may name.
        clock: milliseconds since the epoch for ``sent_at`` and expiry (the store's clock must agree).
        sweep_every: seconds between background sweeps of expired envelopes; None = no sweeps.
    """

    def __init__(
        self,
        contract: Contract[Body],
        inbox: IInboxStore,
        registry: IRegistry,
        *,
        metrics: CollectorRegistry | None = None,
        max_wait: float = MAX_WAIT_SECONDS,
        notices: INoticeStore | None = None,
        remind_after: float = DEFAULT_REMIND_AFTER_SECONDS,
        max_ttl_ms: int = MAX_TTL_MS,
        clock: Callable[[], int] = now_ms,
        sweep_every: float | None = None,
    ) -> None:
        self.contract = contract
        self.metrics = RelayMetrics(metrics)
        self.max_wait = max_wait
        self.remind_after = remind_after
        self.max_ttl_ms = max_ttl_ms
        self.clock = clock
        self.sweep_every = sweep_every
        self._inbox = inbox
        self._registry = registry
        self._notices = notices
        self._backends = _distinct(registry.backend, inbox.backend, *([notices.backend] if notices else []))
        """What the stores run on, each once: one Redis connection for the Redis stores."""
        self._running = False
        self.metrics.parked.set_function(lambda: self._inbox.parked())
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        opened: list[IBackend] = []
        try:
            for backend in self._backends:
                await backend.open()
                opened.append(backend)
        except BaseException:
            await _close_all(reversed(opened))
            raise
        self._running = True
        if self.sweep_every:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(self.sweep_every))

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await _close_all(reversed(self._backends))

    @property
    def running(self) -> bool:
        return self._running

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def ready(self) -> bool:
        """True when running and the backend answers."""
        return self._running and all([await backend.ping() for backend in self._backends])

    # -- registrations ---------------------------------------------------------------------------

    async def register(self, agent: str, address: Address, session: str) -> Registered:
        """Register (or re-register) ``agent`` at ``address`` for ``session``; keeps its inbox."""
        self._check_running()
        check_agent_id(agent)
        check_session_id(session)
        outcome = await self._guard(self._registry.register(agent, address, session))
        return Registered(outcome.registration, outcome.created, outcome.superseded_session)

    async def registration(self, agent: str) -> Registration | None:
        self._check_running()
        check_agent_id(agent)
        return await self._guard(self._registry.get(agent))

    async def leave(self, agent: str, session: str) -> bool:
        """``session`` of ``agent`` says it ended: its presence is ``gone`` until its next sign
        (``IRegistry.leave``); False when it is not the registered session (nothing changes)."""
        self._check_running()
        check_agent_id(agent)
        check_session_id(session)
        return await self._guard(self._registry.leave(agent, session))

    async def registrations(self, limit: int = 1000, after: str | None = None) -> list[Registration]:
        """Up to ``limit`` registrations by agent id, those after ``after`` when given."""
        self._check_running()
        return await self._guard(self._registry.list(limit, after))

    # -- messaging -------------------------------------------------------------------------------

    async def send(
        self,
        sender: str,
        to: str,
        body: Body,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
        ttl_ms: int | None = None,
    ) -> Envelope[Body]:
        """Validate ``body`` and queue it in ``to``'s inbox.

        With ``idempotency_key``, a repeat of the same send by ``sender`` within the dedup window returns
        the first send's envelope (same id and sent_at) and stores nothing. With ``ttl_ms``
        (``MIN_TTL_MS`` to ``max_ttl_ms``), the envelope is never handed out after that long.
        Raises:
            ContractViolation, InvalidArgument, UnregisteredAgent, AgentRetired, SessionSuperseded,
            UnknownRecipient,
            NotAccepted (the recipient's contact policy), InboxFull, IdempotencyConflict, RateLimited,
            BackendUnavailable. Nothing is stored when any is raised.
        """
        self._check_running()
        check_agent_id(sender, "from")
        check_agent_id(to, "to")
        if session is not None:
            check_session_id(session)
        if ttl_ms is not None:
            check_ttl(ttl_ms, self.max_ttl_ms)
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
        self._validate(body)
        fields = self.contract.to_fields(body)
        if not RESERVED_FIELDS.isdisjoint(fields):
            raise ValueError(f"contract fields clash with envelope fields: {RESERVED_FIELDS & set(fields)}")
        sent_at_ms = self.clock()
        options = _NO_OPTIONS
        if idempotency_key is not None or ttl_ms is not None:
            options = SendOptions(
                idempotency_key=idempotency_key,
                request_hash=request_hash(to, fields, ttl_ms) if idempotency_key is not None else None,
                expires_at_ms=sent_at_ms + ttl_ms if ttl_ms is not None else None,
            )
        try:  # = self._guard(...), inlined on the hot path
            appended = await self._inbox.append(
                sender, to, fields, sent_at_ms=sent_at_ms, sender_session=session, options=options
            )
        except RelayError as exc:
            self.metrics.refused.labels(code=exc.code).inc()
            if isinstance(exc, NotAccepted):
                self.metrics.not_accepted.labels(tier=exc.tier).inc()
            raise
        if not appended.repeated:
            self.metrics.count_sent(appended.tier)
        return Envelope(
            id=appended.envelope_id,
            sender=sender,
            to=to,
            tier=appended.tier,
            message=body,
            sent_at_ms=appended.sent_at_ms,
        )

    async def fetch(
        self,
        agent: str,
        limit: int = DEFAULT_FETCH_LIMIT,
        wait: float | None = None,
        *,
        session: str | None = None,
    ) -> list[Envelope[Body]]:
        """Unacknowledged envelopes of ``agent``, oldest first, at most ``limit`` (1..``MAX_FETCH_LIMIT``).

        With ``wait`` (seconds, capped at ``max_wait``) block until one arrives when the inbox is empty.
        """
        self._check_running()
        check_agent_id(agent)
        if session is not None:
            check_session_id(session)
        check_fetch_limit(limit)
        if wait is not None:
            if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
                raise InvalidArgument("wait", "wait.range", "must be a non-negative number of seconds")
            wait = min(float(wait), self.max_wait)
        try:  # = self._guard(...), inlined on the hot path
            fetched = await self._inbox.fetch(agent, limit, wait=wait, session=session)
        except RelayError as exc:
            self.metrics.refused.labels(code=exc.code).inc()
            raise
        for tier, reason in fetched.dead_lettered:
            self.metrics.count_dead(tier, reason)
        envelopes: list[Envelope[Body]] = []
        fresh: dict[Tier, int] = {}
        for entry in fetched.envelopes:
            envelopes.append(
                Envelope(
                    id=entry.envelope_id,
                    sender=entry.sender,
                    to=entry.to,
                    tier=entry.tier,
                    message=self.contract.from_fields(entry.fields),
                    sent_at_ms=entry.sent_at_ms,
                    deliveries=entry.deliveries,
                    expires_at_ms=entry.expires_at_ms,
                )
            )
            if entry.first_delivery:
                fresh[entry.tier] = fresh.get(entry.tier, 0) + 1
        for tier, n in fresh.items():
            self.metrics.count_delivered(tier, n)
        return envelopes

    def parked_fetches(self, agent: str | None = None) -> int:
        """Fetches parked (waiting for mail) in this process now: ``agent``'s, or all of them."""
        return self._inbox.parked(agent)

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> Acknowledged:
        """Acknowledge envelopes of ``agent``'s own inbox. Harmless to repeat."""
        self._check_running()
        check_agent_id(agent)
        if session is not None:
            check_session_id(session)
        check_envelope_ids(ids, MAX_ACK_IDS, returned_by="fetch")
        unique = list(dict.fromkeys(ids))
        try:  # = self._guard(...), inlined on the hot path
            outcome = await self._inbox.ack(agent, unique, session=session)
        except RelayError as exc:
            self.metrics.refused.labels(code=exc.code).inc()
            raise
        if outcome.acknowledged:
            self.metrics.acknowledged.inc(len(outcome.acknowledged))
        return Acknowledged(outcome.acknowledged, outcome.unknown, outcome.origins)

    # -- mail-pending notices --------------------------------------------------------------------

    async def wait_for_mail(self, agent: str, session: str, wait: float) -> MailNotice[Body]:
        """Wait up to ``wait`` seconds (capped at ``MAX_NOTICE_WAIT_SECONDS``) until ``agent`` has mail
        it was not told about, or a reminder of unacknowledged mail falls due (``remind_after``).

        Read-only for the inbox: nothing is acknowledged, no delivery is counted, fetch results are
        unchanged (``broker.ports.INoticeStore``). Parks like a blocking fetch, under the same caps.
        Raises:
            InvalidArgument, UnregisteredAgent, SessionSuperseded, SessionNotRegistered, TooManyWaits,
            BackendUnavailable.
        """
        self._check_running()
        check_agent_id(agent)
        check_session_id(session)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            raise InvalidArgument("wait", "wait.range", "must be a non-negative number of seconds")
        if self._notices is None:
            raise RelayNotRunning("this relay was built without a notice store; pass notices=")
        notice: Notice = await self._guard(
            self._notices.wait(
                agent,
                session,
                seconds=min(float(wait), MAX_NOTICE_WAIT_SECONDS),
                remind_after=self.remind_after,
                listed=NOTICE_LISTED,
            )
        )
        if notice.count:
            self.metrics.notices.labels(kind="reminder" if notice.reminder else "new").inc()
        envelopes = tuple(
            Envelope(
                id=one.envelope_id,
                sender=one.sender,
                to=agent,
                tier=one.tier,
                message=self.contract.from_fields(one.fields),
                sent_at_ms=one.sent_at_ms,
            )
            for one in notice.envelopes
        )
        return MailNotice(notice.count, notice.unacknowledged, notice.reminder, envelopes)

    async def status(
        self, sender: str, ids: Sequence[str], *, session: str | None = None
    ) -> list[MessageStatus]:
        """What became of envelopes ``sender`` sent (1..``MAX_STATUS_IDS`` ids), one status per id in
        order; see ``IInboxStore.status``. Ids of others' envelopes read ``unknown``."""
        self._check_running()
        check_agent_id(sender)
        if session is not None:
            check_session_id(session)
        check_envelope_ids(ids, MAX_STATUS_IDS, least=1, returned_by="SendAgentMessage")
        return await self._guard(self._inbox.status(sender, list(ids), session=session))

    async def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """Move expired envelopes among the ``limit`` oldest of every registered agent's inbox to its
        dead letters; returns how many moved.

        Walks every registration, ``SWEEP_PAGE`` at a time in agent id order. An agent whose sweep the
        store refuses (``BackendRefused``: its keys are damaged) is logged and skipped, so it never
        keeps the agents after it from being swept; a store that cannot be reached
        (``BackendUnavailable``) ends the walk, and the next sweep starts it again."""
        self._check_running()
        moved, after = 0, None
        for _ in range(SWEEP_MAX_PAGES):
            page = await self.registrations(SWEEP_PAGE, after)
            for registration in page:
                try:
                    dropped = await self._guard(self._inbox.sweep(registration.agent, limit))
                except BackendRefused as exc:
                    log.warning("sweep of %s refused, skipped: %s", registration.agent, exc)
                    continue
                for tier, reason in dropped:
                    self.metrics.count_dead(tier, reason)
                    moved += 1
            if len(page) < SWEEP_PAGE:
                break
            after = page[-1].agent
        return moved

    async def _sweep_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.sweep()
            except RelayError as exc:
                log.warning("sweep of expired envelopes failed, trying again later: %s", exc)
            except Exception:  # the sweeper must outlive a bug: fetch enforces expiry anyway
                log.exception("sweep of expired envelopes failed unexpectedly, trying again later")

    # -- internals -------------------------------------------------------------------------------

    def _check_running(self) -> None:
        if not self._running:
            raise RelayNotRunning("the relay is not running; start it first")

    def _validate(self, body: Body) -> None:
        try:
            self.contract.validate(body)
        except RelayError as exc:
            self.metrics.refused.labels(code=exc.code).inc()
            raise

    async def _guard(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except RelayError as exc:
            self.metrics.refused.labels(code=exc.code).inc()
            raise


_NO_OPTIONS: Final = SendOptions()


def _distinct(*backends: IBackend) -> tuple[IBackend, ...]:
    """``backends`` in order, each object once (stores on one connection name the same one)."""
    return tuple({id(backend): backend for backend in backends}.values())


async def _close_all(backends: Iterable[IBackend]) -> None:
    """Close each of ``backends``, all of them even when one fails (the first failure is raised)."""
    failure: BaseException | None = None
    for backend in backends:
        try:
            await backend.close()
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
