"""The delivery port: at-least-once delivery to in-process receive loops, with dead letters.

``IInboxStore.fetch`` serves pull clients (MCP): every fetch hands out every unacknowledged envelope
again. In-process agents are served by receive loops instead (``broker.messenger``), possibly several
per agent in several processes, and those need each envelope to be held by exactly one loop at a time.
``IDeliveryQueue`` gives them that on the same inboxes (see docs/delivery.md):

- Each loop is a *consumer* with its own name (``<agent>@<loop-id>``). ``claim`` hands an envelope to
  one consumer; nobody else gets it while that consumer holds it.
- A consumer that stops touching an envelope for longer than the *visibility timeout* is presumed
  dead: the next ``claim`` of any consumer takes the envelope over.
- The delivery count (``StoredEnvelope.deliveries``) is kept by the store, so it survives the death of
  the process that was handling the envelope; it is the attempt number.
- An envelope that failed too often moves to the agent's dead-letter list, from where it can be listed
  and requeued.

``DeliverySettings`` is the policy a receive loop applies on top: attempts, visibility, backoff.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from broker.envelope import Tier
from broker.ports import AckOutcome, StoredEnvelope

CONSUMER_SEPARATOR: Final = "@"
"""Receive-loop consumers are named ``<agent>@<loop-id>``; the MCP fetch path uses the bare agent id."""

DEAD_LETTER_FIELDS: Final = frozenset({"envelope_id", "attempts", "reason", "dead_at"})
"""Fields a dead letter adds to the envelope's own; a contract's body fields must not use them."""

REQUEUED_FROM: Final = "requeued_from"
"""Field a requeued envelope carries: the envelope id it had before it was dead-lettered, then the ids
it had before earlier requeues (newest first, space-separated, at most ``REQUEUE_LINEAGE``)."""


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """How a messenger delivers. Times are seconds.

    ``visibility``: how long an envelope may sit untouched with a loop before another loop takes it
    over (the loop is presumed dead). Backoff and the handler timeout are kept below it so a live loop
    never loses an envelope it is working on.
    """

    max_attempts: int = 5
    visibility: float = 30.0
    backoff_base: float = 0.5
    backoff_cap: float = 10.0
    poll: float = 1.0
    """Longest a loop blocks waiting for new envelopes before it looks for idle ones again."""
    handler_timeout: float | None = None
    """Longest ``serve`` lets a handler run (an overrun is a failed attempt); default visibility / 2."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not self.visibility > 0 or not self.poll > 0:
            raise ValueError("visibility and poll must be positive")
        if self.backoff_base < 0 or self.backoff_cap < self.backoff_base:
            raise ValueError("need 0 <= backoff_base <= backoff_cap")
        if self.handler_timeout is not None and not 0 < self.handler_timeout <= self.visibility / 2:
            raise ValueError("handler_timeout must be positive and at most visibility / 2")

    @property
    def handler_limit(self) -> float:
        return self.handler_timeout if self.handler_timeout is not None else self.visibility / 2

    @property
    def renew_after(self) -> float:
        """Held this long untouched, an envelope is touched before it is handed to the caller."""
        return self.visibility / 4

    def backoff(self, attempt: int) -> float:
        """Delay after failed attempt ``attempt`` (1-based): exponential from ``backoff_base``, capped
        at ``backoff_cap`` and at visibility / 2, with 50-100 % jitter so loops do not retry in step."""
        delay = min(self.backoff_cap, self.backoff_base * 2.0 ** max(0, attempt - 1), self.visibility / 2)
        return delay * random.uniform(0.5, 1.0)

    @property
    def claim_wait(self) -> float:
        return min(self.poll, self.visibility / 2)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An envelope that was given up on, as kept in its recipient's dead-letter list."""

    envelope_id: str
    """The id the envelope had in the inbox (requeueing gives it a new one)."""
    sender: str
    to: str
    tier: Tier
    sent_at_ms: int
    fields: Mapping[str, str]
    """The contract's body fields, unchanged."""
    attempts: int
    """Deliveries the envelope had when it was given up on."""
    reason: str
    dead_at_ms: int
    requeued_from: tuple[str, ...] = ()
    """When the envelope had been requeued before: the ids it had then, newest first."""


class IDeliveryQueue(Protocol):
    """Claim-based delivery over the inboxes of ``IInboxStore`` (same backend, same envelopes).

    Semantics every implementation keeps:
    - ``claim`` hands each envelope to at most one consumer at a time. An envelope stays with its
      consumer until it is acknowledged, dead-lettered, or left untouched (no ``claim``/``retry``/
      ``touch`` of it) for longer than the claimer's ``visibility``; only then may ``claim`` give it to
      another consumer (or the same one again).
    - Every hand-out (``claim``, ``retry``) adds one to the envelope's delivery count, which the store
      keeps across processes; ``touch`` does not.
    - ``ack``, ``dead_letter`` and ``requeue`` are atomic: an envelope is in the inbox or in the
      dead-letter list, never both, never neither.
    - Idle time is measured by the store (the Redis server's clock), not by the callers.
    """

    async def open(self) -> None:
        """Prepare connections/scripts. Raises ``BackendUnavailable``."""
        ...

    async def close(self) -> None: ...

    async def claim(
        self,
        agent: str,
        consumer: str,
        limit: int,
        *,
        visibility: float,
        wait: float | None = None,
    ) -> list[StoredEnvelope]:
        """Hand up to ``limit`` envelopes of ``agent``'s inbox to ``consumer``, oldest first.

        First envelopes left idle for at least ``visibility`` seconds by whoever held them (taken over,
        their delivery count goes up by one), then envelopes nobody was handed yet. ``deliveries`` is
        the delivery count after this hand-out; ``first_delivery`` is True only for envelopes never
        handed to anyone before. Envelopes ``consumer`` already holds are not returned again.

        When nothing is available and ``wait`` is positive, block up to ``wait`` seconds for a new
        envelope (idle ones are looked for again only on the next call).
        Raises:
            UnregisteredAgent: ``agent`` has no registration.  BackendUnavailable.
        """
        ...

    async def retry(self, agent: str, consumer: str, envelope_id: str) -> int:
        """Hand an envelope ``consumer`` holds to ``consumer`` again, for another attempt.

        Its delivery count goes up by one and its idle time restarts, so no other consumer takes it
        while the caller backs off (keep the backoff below the visibility timeout).
        Returns:
            The new delivery count, or 0 when ``consumer`` no longer holds the envelope (acknowledged,
            dead-lettered or taken over): the caller must then drop it.
        Raises:
            BackendUnavailable.
        """
        ...

    async def touch(self, agent: str, consumer: str, ids: Sequence[str]) -> list[str]:
        """Restart the idle time of envelopes ``consumer`` holds, without counting a delivery.

        Returns:
            The ids ``consumer`` still holds (in the order given); the others must be dropped.
        Raises:
            BackendUnavailable.
        """
        ...

    async def ack(self, agent: str, ids: Sequence[str]) -> AckOutcome:
        """Acknowledge and delete envelopes of ``agent``'s inbox (the same as ``IInboxStore.ack``).

        Any consumer may acknowledge; acknowledging twice or an unknown id reports it as unknown.
        Raises:
            UnregisteredAgent, BackendUnavailable.
        """
        ...

    async def dead_letter(
        self, agent: str, envelope_id: str, reason: str, *, consumer: str | None = None
    ) -> bool:
        """Move a delivered envelope from ``agent``'s inbox to its dead-letter list, atomically.

        The dead letter keeps the envelope's readable fields and records its id, its delivery count
        (``attempts``), ``reason`` and the time. With ``consumer``, only if that consumer holds it.
        Returns:
            True when moved; False when the envelope is not there, was never delivered, or is held by
            another consumer.
        Raises:
            BackendUnavailable.
        """
        ...

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``agent``, oldest first. Raises ``BackendUnavailable``."""
        ...

    async def dead_letter_count(self, agent: str) -> int:
        """How many dead letters ``agent`` has. Raises ``BackendUnavailable``."""
        ...

    async def requeue(self, agent: str, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters back into ``agent``'s inbox, atomically per call, oldest first.

        Each becomes a new inbox entry at the end of the inbox (so a new envelope id, delivery count
        0) with its sender, tier, ``sent_at`` and body fields, plus ``requeued_from`` = its old id and
        the ids it had before (``REQUEUED_FROM``). It stays its sender's: the sender's status of the
        old id follows it (``IInboxStore.status``), and replies to the old id answer it
        (``IOperatorView.thread``).
        The inbox cap does not apply: an operator asked for it.
        Args:
            ids: envelope ids as listed by ``dead_letters``; ids not found are skipped. None: all.
        Returns:
            The new envelope ids, in requeue order.
        Raises:
            BackendUnavailable.
        """
        ...

    async def release(self, agent: str, consumer: str, ids: Sequence[str] = ()) -> None:
        """End ``consumer``: hand back the envelopes ``ids`` it holds but never started (any claim
        takes them over at once; the hand-out stays counted), then forget the consumer if it holds
        nothing. What it still holds is taken over after the visibility timeout.
        Raises:
            BackendUnavailable.
        """
        ...
