"""Tiers and envelopes."""

from __future__ import annotations

import enum
import functools
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Generic, TypeVar

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
    envelope returned by ``send``. ``expires_at`` is set when it was sent with a ttl.
    """

    id: str
    sender: str
    to: str
    tier: Tier
    message: Body
    sent_at: datetime
    deliveries: int = 0
    expires_at: datetime | None = None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)


def to_ms(moment: datetime) -> int:
    """Milliseconds since the epoch, exactly (``timestamp() * 1000`` loses one now and then to float
    rounding: 2026-11-29T13:37:32.345Z would come back as ...344)."""
    if moment.tzinfo is None:  # naive: local time, as ``datetime.timestamp`` reads it
        return int(moment.timestamp() * 1000)
    return (moment - _EPOCH) // _ONE_MS


def format_ms(ms: int) -> str:
    """``format_time(from_ms(ms))``; the text up to the second is cached (sends in the same second
    share it)."""
    second, millis = divmod(ms, 1000)
    return f"{_second_text(second)}{millis:03d}Z"


@functools.lru_cache(maxsize=16)
def _second_text(second: int) -> str:
    return _spelled(from_ms(second * 1000))[:-4]


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-11-29T13:45:12.345Z``."""
    if moment.tzinfo is UTC and moment.year >= 1970:  # what envelopes carry: through format_ms's cache
        return format_ms(to_ms(moment))
    return _spelled(moment)


def _spelled(moment: datetime) -> str:
    m = moment.astimezone(UTC)
    if m.year < 1000:  # strftime's %Y does not pad: keep its spelling
        return m.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return (
        f"{m.year}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}."
        f"{moment.microsecond // 1000:03d}Z"
    )


_CANONICAL: Final = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z", re.ASCII)


def parse_ms(text: str) -> int:
    """``to_ms(parse_time(text))``; the value of the text up to the second is cached (entries read
    together were mostly sent in the same second)."""
    millis = text[20:23]
    if len(text) == 24 and text[23] == "Z" and millis.isascii() and millis.isdigit():
        second_ms = _canonical_second_ms(text[:20])
        if second_ms is not None:
            return second_ms + int(millis)
    return to_ms(parse_time(text))


@functools.lru_cache(maxsize=16)
def _canonical_second_ms(prefix: str) -> int | None:
    """The milliseconds of ``prefix + "000Z"`` when that is exactly what ``format_time`` writes."""
    text = prefix + "000Z"
    return to_ms(parse_time(text)) if _CANONICAL.fullmatch(text) is not None else None


def parse_time(text: str) -> datetime:
    found = _CANONICAL.fullmatch(text)
    if found is None:  # not the exact form format_time writes: the general (slower) parser decides
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    year, month, day, hour, minute, second, millis = map(int, found.groups())
    return datetime(year, month, day, hour, minute, second, millis * 1000, tzinfo=UTC)
