"""Tiers and envelopes."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

Body = TypeVar("Body")


class Tier(enum.IntEnum):
    """How far a message travels. Ordered: a wider tier compares greater."""

    IN_PROCESS = 1
    HOST = 2
    NETWORK = 3

    @property
    def label(self) -> str:
        """The lowercase name used in metrics labels, Redis fields and tool results."""
        return _LABELS[self]

    @classmethod
    def from_label(cls, label: str) -> Tier:
        return _BY_LABEL[label]


_LABELS = {Tier.IN_PROCESS: "in_process", Tier.HOST: "host", Tier.NETWORK: "network"}
_BY_LABEL = {v: k for k, v in _LABELS.items()}


def widest(a: Tier, b: Tier) -> Tier:
    """The tier an envelope between an ``a``-tier and a ``b``-tier agent travels."""
    return a if a >= b else b


@dataclass(frozen=True, slots=True)
class Envelope(Generic[Body]):
    """One message in flight. ``sent_at`` is UTC with millisecond precision.

    ``deliveries`` counts how many times the envelope was handed out (1 on first fetch); it is 0 on the
    envelope returned by ``send``.
    """

    id: str
    sender: str
    to: str
    tier: Tier
    message: Body
    sent_at: datetime
    deliveries: int = 0


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-11-29T13:45:12.345Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
