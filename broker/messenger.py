"""``Messenger[Body]``: the in-process face of a ``Relay[Body]``, for agents that live in the relay's
own process.

In-process agents send through the same relay (same envelopes, tier rules and refusals as over MCP)
and receive with at-least-once delivery instead of polling (docs/delivery.md):

- ``receive`` is an async iterator of ``Delivery`` objects; ``await delivery.ack()`` once the
  envelope is handled, ``await delivery.fail(reason)`` to have it retried with backoff. After
  ``max_attempts`` attempts it moves to the agent's dead-letter list.
- ``serve`` is the same as a handler loop: success acknowledges, an exception retries.
- Each receive loop is its own consumer, so several loops (in several processes) can serve one agent:
  each envelope is held by one of them at a time. A loop that dies leaves its envelopes idle; after the
  visibility timeout another loop takes them over. The attempt number is the store's delivery count,
  so it survives the death of a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Generic, Literal, Self, TypeVar

from broker.addresses import Address
from broker.delivery import CONSUMER_SEPARATOR, DeadLetter, DeliverySettings, IDeliveryQueue
from broker.envelope import Envelope, Tier
from broker.errors import BackendUnavailable, ContractViolation, RelayNotRunning
from broker.ids import check_agent_id
from broker.limits import DEFAULT_FETCH_LIMIT, check_fetch_limit
from broker.ports import StoredEnvelope
from broker.relay import Registered, Relay

__all__ = ["Delivery", "FailOutcome", "Handler", "Messenger", "Receiving"]

Body = TypeVar("Body")

log = logging.getLogger("relay.messenger")

FailOutcome = Literal["retrying", "dead_lettered", "lost"]
"""What ``Delivery.fail`` did: scheduled another attempt, gave up (dead letter), or found the envelope
no longer held by this loop (acknowledged elsewhere, or taken over after the visibility timeout)."""

Handler = Callable[[Envelope[Body]], Awaitable[object]]


@dataclass(slots=True, eq=False)
class _Held(Generic[Body]):
    envelope: Envelope[Body]
    attempt: int
    reset_at: float
    """``time.monotonic()`` when the store last restarted this envelope's idle clock for us."""


@dataclass(frozen=True, slots=True, eq=False)
class Delivery(Generic[Body]):
    """One envelope handed to one receive loop. Settle it once: ``ack`` or ``fail``."""

    envelope: Envelope[Body]
    attempt: int
    """1 on the first attempt; the store's delivery count, so it survives process death."""
    _receiving: Receiving[Body] = field(repr=False)

    async def ack(self) -> bool:
        """Acknowledge: the envelope is deleted and never delivered again. False if this loop no
        longer held it (it may then be delivered again, or was already acknowledged)."""
        return await self._receiving.settle_ack(self.envelope.id)

    async def fail(self, reason: str) -> FailOutcome:
        """Give the attempt up: retry after a backoff, or dead-letter after ``max_attempts``.
        ``reason`` is stored with a dead letter; keep message text out of it."""
        return await self._receiving.settle_fail(self.envelope.id, reason)


class Messenger(Generic[Body]):
    """Send and receive ``Body`` messages in-process on ``relay``.

    Args:
        relay: the started relay (its contract, its metrics registry).
        queue: the delivery queue of the same backend as the relay's inbox store.
        settings: attempts, visibility timeout, backoff.
    """

    def __init__(
        self, relay: Relay[Body], queue: IDeliveryQueue, settings: DeliverySettings | None = None
    ) -> None:
        self.relay = relay
        self.queue = queue
        self.settings = settings or DeliverySettings()

    async def start(self) -> None:
        await self.queue.open()

    async def stop(self) -> None:
        await self.queue.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def register(self, agent: str, address: Address, session: str) -> Registered:
        return await self.relay.register(agent, address, session)

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
        """``Relay.send``: validate and queue ``body``; the same options and refusals as over MCP."""
        return await self.relay.send(
            sender, to, body, session=session, idempotency_key=idempotency_key, ttl_ms=ttl_ms
        )

    def receive(
        self,
        agent: str,
        *,
        limit: int = DEFAULT_FETCH_LIMIT,
        wait: float | None = None,
        stop: asyncio.Event | None = None,
    ) -> Receiving[Body]:
        """Deliveries for ``agent``, oldest first (taken-over envelopes, then new ones).

        Iterates until ``stop`` is set, or, with ``wait``, until ``wait`` seconds pass without a
        delivery. Use it as ``async with messenger.receive(...) as deliveries: async for d in
        deliveries``, so what the loop holds unseen is handed back when it ends. Each call is a new
        consumer (``<agent>@<host>.<pid>.<random>``). ``limit`` is how many envelopes one claim takes.
        """
        check_agent_id(agent)
        check_fetch_limit(limit)
        return Receiving(self, agent, limit, wait, stop)

    async def serve(
        self,
        agent: str,
        handler: Handler[Body],
        *,
        stop: asyncio.Event | None = None,
        limit: int = DEFAULT_FETCH_LIMIT,
    ) -> None:
        """Run ``handler`` on every envelope for ``agent``, one at a time, until ``stop`` is set.

        Returning acknowledges the envelope; raising (or running longer than the handler timeout)
        fails the attempt: it is retried with backoff, and dead-lettered after ``max_attempts``.
        Setting ``stop`` ends a wait at once; a handler already running is let finish (it is bounded
        by the handler timeout).
        """
        async with self.receive(agent, limit=limit, stop=stop) as deliveries:
            async for delivery in deliveries:
                try:
                    await asyncio.wait_for(handler(delivery.envelope), self.settings.handler_limit)
                except Exception as exc:
                    settle: Awaitable[object] = delivery.fail(_reason(exc))
                else:
                    settle = delivery.ack()
                try:
                    await settle
                except BackendUnavailable as exc:
                    # the envelope stays pending: another attempt comes after the visibility timeout
                    log.warning("could not settle a delivery: %s", exc.message, extra=_event(delivery))

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]:
        check_agent_id(agent)
        return await self.queue.dead_letters(agent, limit)

    async def dead_letter_count(self, agent: str) -> int:
        check_agent_id(agent)
        return await self.queue.dead_letter_count(agent)

    async def requeue(self, agent: str, ids: Sequence[str] | None = None) -> list[str]:
        """Put dead letters (all, or those with ``ids``) back into the inbox; returns the new ids."""
        check_agent_id(agent)
        return await self.queue.requeue(agent, ids)


class Receiving(Generic[Body]):
    """One receive loop: an async iterator of ``Delivery`` and an async context manager."""

    def __init__(
        self,
        messenger: Messenger[Body],
        agent: str,
        limit: int,
        wait: float | None,
        stop: asyncio.Event | None,
    ) -> None:
        self.messenger = messenger
        self.agent = agent
        self.limit = limit
        self.wait = wait
        self.stop = stop
        self.consumer = f"{agent}{CONSUMER_SEPARATOR}{_loop_id()}"
        self._settings = messenger.settings
        self._ready: deque[_Held[Body]] = deque()
        self._retries: list[tuple[float, _Held[Body]]] = []
        self._out: dict[str, _Held[Body]] = {}
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Delivery[Body]]:
        return self

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the loop: hand back what it claimed but did not hand out, then forget the consumer if
        it holds nothing (deliveries handed out and not settled stay until the visibility timeout)."""
        if self._closed:
            return
        self._closed = True
        unseen = [h.envelope.id for h in self._ready] + [h.envelope.id for _, h in self._retries]
        self._ready.clear()
        self._retries.clear()
        try:
            await self.messenger.queue.release(self.agent, self.consumer, unseen)
        except BackendUnavailable as exc:
            log.warning("could not release a receive loop: %s", exc.message, extra={"agent": self.agent})

    async def __anext__(self) -> Delivery[Body]:
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while True:
            if self._closed or (self.stop is not None and self.stop.is_set()):
                raise StopAsyncIteration
            held = await self._next_held()
            if held is not None:
                self._out[held.envelope.id] = held
                return Delivery(held.envelope, held.attempt, self)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise StopAsyncIteration
            timeout = self._settings.claim_wait
            if self._retries:
                timeout = min(timeout, max(0.0, self._retries[0][0] - now))
            if deadline is not None:
                timeout = min(timeout, deadline - now)
            await self._claim(timeout)

    async def _next_held(self) -> _Held[Body] | None:
        while True:
            now = time.monotonic()
            if self._retries and self._retries[0][0] <= now:
                candidate = self._retries.pop(0)[1]
            elif self._ready:
                candidate = self._ready.popleft()
            else:
                return None
            if now - candidate.reset_at <= self._settings.renew_after:
                return candidate
            # held long enough that the idle clock matters: renew it (and its batch) or drop it
            stale = [candidate, *(h for h in self._ready if now - h.reset_at > self._settings.renew_after)]
            kept = set(await self._queue.touch(self.agent, self.consumer, [h.envelope.id for h in stale]))
            for h in stale:
                h.reset_at = now
            self._ready = deque(h for h in self._ready if h.envelope.id in kept or h not in stale)
            if candidate.envelope.id in kept:
                return candidate

    @property
    def _queue(self) -> IDeliveryQueue:
        return self.messenger.queue

    async def _claim(self, wait: float) -> None:
        relay = self.messenger.relay
        if not relay.running:
            raise RelayNotRunning("the relay is not running; start it first")
        try:
            stored = await self._until_stopped(
                self._queue.claim(
                    self.agent, self.consumer, self.limit, visibility=self._settings.visibility, wait=wait
                )
            )
        except BackendUnavailable as exc:
            log.warning("claim failed: %s", exc.message, extra={"agent": self.agent})
            await self._until_stopped(asyncio.sleep(min(self._settings.claim_wait, 1.0)))
            return
        now = time.monotonic()
        fresh: dict[Tier, int] = {}
        for entry in stored or []:
            if entry.first_delivery:
                fresh[entry.tier] = fresh.get(entry.tier, 0) + 1
            await self._take(entry, now)
        for tier, n in fresh.items():
            relay.metrics.count_delivered(tier, n)

    async def _take(self, entry: StoredEnvelope, now: float) -> None:
        limit = self._settings.max_attempts
        if entry.deliveries > limit:
            # attempts ran out in loops that died (or were stopped) while handling it
            reason = f"delivered {entry.deliveries} times without an acknowledgement"
            await self._give_up(entry.envelope_id, entry.tier, entry.sender, entry.deliveries, reason)
            return
        try:
            body = self.messenger.relay.contract.from_fields(entry.fields)
        except ContractViolation as exc:
            await self._give_up(entry.envelope_id, entry.tier, entry.sender, entry.deliveries, exc.message)
            return
        envelope = Envelope(
            id=entry.envelope_id,
            sender=entry.sender,
            to=entry.to,
            tier=entry.tier,
            message=body,
            sent_at_ms=entry.sent_at_ms,
            deliveries=entry.deliveries,
        )
        self._out.pop(entry.envelope_id, None)
        self._ready = deque(h for h in self._ready if h.envelope.id != entry.envelope_id)
        self._ready.append(_Held(envelope, entry.deliveries, now))

    async def _give_up(self, envelope_id: str, tier: Tier, sender: str, attempts: int, reason: str) -> bool:
        moved = await self._queue.dead_letter(self.agent, envelope_id, reason[:500], consumer=self.consumer)
        if moved:
            self.messenger.relay.metrics.dead_lettered.labels(tier=tier.label).inc()
            log.warning(
                "dead-lettered after %d attempts",
                attempts,
                extra={"envelope": envelope_id, "from": sender, "to": self.agent, "outcome": "dead_letter"},
            )
        return moved

    async def settle_ack(self, envelope_id: str) -> bool:
        if self._out.get(envelope_id) is None:
            return False
        outcome = await self._queue.ack(self.agent, [envelope_id])
        del self._out[envelope_id]
        if outcome.acknowledged:
            self.messenger.relay.metrics.acknowledged.inc(len(outcome.acknowledged))
        return bool(outcome.acknowledged)

    async def settle_fail(self, envelope_id: str, reason: str) -> FailOutcome:
        held = self._out.get(envelope_id)
        if held is None:
            return "lost"
        envelope = held.envelope
        if held.attempt >= self._settings.max_attempts:
            moved = await self._give_up(envelope.id, envelope.tier, envelope.sender, held.attempt, reason)
            del self._out[envelope_id]
            return "dead_lettered" if moved else "lost"
        count = await self._queue.retry(self.agent, self.consumer, envelope.id)
        del self._out[envelope_id]
        if count == 0:
            return "lost"
        now = time.monotonic()
        delay = self._settings.backoff(held.attempt)
        retried = _Held(replace(envelope, deliveries=count), count, now)
        self._retries.append((now + delay, retried))
        self._retries.sort(key=lambda item: item[0])
        log.warning(
            "attempt %d of %d failed (%s); retrying in %.2f s",
            held.attempt,
            self._settings.max_attempts,
            reason.split(":", 1)[0][:80],
            delay,
            extra={"envelope": envelope.id, "from": envelope.sender, "to": self.agent, "outcome": "retry"},
        )
        return "retrying"

    async def _until_stopped(self, awaitable: Awaitable[object]) -> list[StoredEnvelope] | None:
        """Await ``awaitable`` unless ``stop`` is set first (then cancel it and return None)."""
        if self.stop is None:
            result = await awaitable
        else:
            task = asyncio.ensure_future(awaitable)
            stopped = asyncio.ensure_future(self.stop.wait())
            try:
                await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        # a claim cut short while its store call was on its way may still take
                        # entries: the store hands them back when the call answers
                        await task
            if task.cancelled():
                return None
            result = task.result()
        return result if isinstance(result, list) else None


def _loop_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:32] or "host"
    return f"{host}.{os.getpid()}.{secrets.token_hex(4)}"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, TimeoutError) and not text:  # the handler timeout's own (a handler's says why)
        return "TimeoutError: the handler ran longer than the handler timeout"
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


def _event(delivery: Delivery[Body]) -> dict[str, object]:
    envelope = delivery.envelope
    return {"envelope": envelope.id, "from": envelope.sender, "to": envelope.to}
