"""``Relay[Body]``: register, send, fetch and acknowledge on top of the storage ports.

The relay is a runtime service: it owns no listener. Build it, ``start`` it (or ``async with`` it), and
hand it to whatever needs it (the HTTP front, a ``Messenger``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Generic, Self, TypeVar

from prometheus_client import CollectorRegistry

from broker.addresses import Address
from broker.contract import RESERVED_FIELDS, Contract
from broker.envelope import Envelope, Tier, from_ms, now_ms
from broker.errors import InvalidArgument, RelayError, RelayNotRunning
from broker.ids import check_agent_id, check_idempotency_key, check_session_id, is_envelope_id
from broker.metrics import RelayMetrics
from broker.ports import (
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

MAX_FETCH_LIMIT = 256
"""Envelopes one fetch returns at most."""
DEFAULT_FETCH_LIMIT = 16
"""Envelopes one fetch returns at most when the caller names no limit."""
MAX_ACK_IDS = 1024
"""Envelope ids one acknowledgement takes at most."""
MAX_WAIT_SECONDS = 25.0
"""The longest a blocking fetch waits unless a relay is built with another ``max_wait``."""
MAX_NOTICE_WAIT_SECONDS = 300.0
"""The longest a mail-pending wait (``wait_for_mail``) parks."""
DEFAULT_REMIND_AFTER_SECONDS = 3600.0
"""Unacknowledged mail is announced again at most this often unless a relay is built otherwise."""
NOTICE_LISTED = 5
"""Envelopes a notice lists at most (its ``count`` says how many it announces)."""
MIN_TTL_MS = 1000
"""The shortest ``ttl_ms`` of a send."""
MAX_TTL_MS = 30 * 24 * 3600 * 1000
"""The longest ``ttl_ms`` of a send unless a relay is built with another ``max_ttl_ms``."""
DEFAULT_MAX_DELIVERIES = 10
"""Hand-outs of an unacknowledged envelope before fetch dead-letters it (``relay serve``'s default)."""
DEFAULT_IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000
"""How long a sender's idempotency key is remembered."""
DEFAULT_STATUS_RETENTION_MS = 7 * 24 * 3600 * 1000
"""How long a sender can learn what became of an envelope."""
MAX_STATUS_IDS = 256
"""Envelope ids one status request takes at most."""
SWEEP_BATCH = 256
"""The oldest envelopes of each inbox one background sweep looks at."""

log = logging.getLogger("relay.core")


def check_fetch_limit(limit: object) -> int:
    """``limit`` if it is a whole number from 1 to ``MAX_FETCH_LIMIT``, else ``InvalidArgument``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FETCH_LIMIT:
        raise InvalidArgument("limit", "limit.range", f"must be an integer from 1 to {MAX_FETCH_LIMIT}")
    return limit


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
        self._running = False
        self.metrics.parked.set_function(lambda: self._inbox.parked())
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        await self._registry.open()
        try:
            await self._inbox.open()
            if self._notices is not None:
                await self._notices.open()
        except BaseException:
            await self._registry.close()
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
        try:
            if self._notices is not None:
                await self._notices.close()
            await self._inbox.close()
        finally:
            await self._registry.close()

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
        return self._running and await self._inbox.ping() and await self._registry.ping()

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
            ContractViolation, InvalidArgument, UnregisteredAgent, SessionSuperseded, UnknownRecipient,
            InboxFull, IdempotencyConflict, RateLimited, BackendUnavailable. Nothing is stored when any
            is raised.
        """
        self._check_running()
        check_agent_id(sender, "from")
        check_agent_id(to, "to")
        if session is not None:
            check_session_id(session)
        if ttl_ms is not None:
            self._check_ttl(ttl_ms)
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
            raise
        if not appended.repeated:
            self.metrics.count_sent(appended.tier)
        return Envelope(
            id=appended.envelope_id,
            sender=sender,
            to=to,
            tier=appended.tier,
            message=body,
            sent_at=from_ms(appended.sent_at_ms),
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
                    sent_at=from_ms(entry.sent_at_ms),
                    deliveries=entry.deliveries,
                    expires_at=from_ms(entry.expires_at_ms) if entry.expires_at_ms is not None else None,
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
        if isinstance(ids, str) or not isinstance(ids, Sequence):
            raise InvalidArgument("ids", "ids.type", "must be a list of envelope ids")
        if len(ids) > MAX_ACK_IDS:
            raise InvalidArgument("ids", "ids.max_items", f"at most {MAX_ACK_IDS} ids per call")
        for i, envelope_id in enumerate(ids):
            if not is_envelope_id(envelope_id):
                raise InvalidArgument(
                    f"ids[{i}]",
                    "envelope_id.pattern",
                    f"{envelope_id!r:.80} is not an envelope id (env_ followed by 26 base32 characters); "
                    "pass ids exactly as fetch returned them",
                )
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
            InvalidArgument, UnregisteredAgent, SessionSuperseded, TooManyWaits, BackendUnavailable.
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
                sent_at=from_ms(one.sent_at_ms),
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
        if isinstance(ids, str) or not isinstance(ids, Sequence):
            raise InvalidArgument("ids", "ids.type", "must be a list of envelope ids")
        if not 1 <= len(ids) <= MAX_STATUS_IDS:
            raise InvalidArgument("ids", "ids.size", f"must hold 1 to {MAX_STATUS_IDS} envelope ids")
        for i, envelope_id in enumerate(ids):
            if not is_envelope_id(envelope_id):
                raise InvalidArgument(
                    f"ids[{i}]",
                    "envelope_id.pattern",
                    f"{envelope_id!r:.80} is not an envelope id (env_ followed by 26 base32 characters); "
                    "pass ids exactly as SendAgentMessage returned them",
                )
        return await self._guard(self._inbox.status(sender, list(ids), session=session))

    async def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """Move expired envelopes among the ``limit`` oldest of every registered agent's inbox to its
        dead letters; returns how many moved."""
        self._check_running()
        moved = 0
        for registration in await self.registrations():
            for tier, reason in await self._guard(self._inbox.sweep(registration.agent, limit)):
                self.metrics.count_dead(tier, reason)
                moved += 1
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

    def _check_ttl(self, ttl_ms: object) -> None:
        if (
            isinstance(ttl_ms, bool)
            or not isinstance(ttl_ms, int)
            or not MIN_TTL_MS <= ttl_ms <= self.max_ttl_ms
        ):
            raise InvalidArgument(
                "ttl_ms",
                "ttl_ms.range",
                f"must be a whole number of milliseconds from {MIN_TTL_MS} to {self.max_ttl_ms}",
            )

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


def request_hash(to: str, fields: Mapping[str, str], ttl_ms: int | None) -> str:
    """What makes two sends with one idempotency key the same request: recipient, body fields, ttl."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (to, str(ttl_ms), *sorted(f"{k}={v}" for k, v in fields.items())):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.hexdigest()
