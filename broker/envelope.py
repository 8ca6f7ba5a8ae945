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
    """One message in flight. ``sent_at_ms`` is milliseconds since the epoch (relay's one shape of a
    time); ``sent_at`` is the same moment as a UTC ``datetime``, for Python callers.

    ``deliveries`` counts how many times the envelope was handed out (1 on first fetch); it is 0 on the
    envelope returned by ``send``. ``expires_at_ms`` is set when it was sent with a ttl.
    """

    id: str
    sender: str
    to: str
    tier: Tier
    message: Body
    sent_at_ms: int
    deliveries: int = 0
    expires_at_ms: int | None = None

    @property
    def sent_at(self) -> datetime:
        return from_ms(self.sent_at_ms)

    @property
    def expires_at(self) -> datetime | None:
        return None if self.expires_at_ms is None else from_ms(self.expires_at_ms)


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


_YEAR_10000_MS: Final = 253_402_300_800_000


def format_ms(ms: int) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z`` (``2026-11-29T13:45:12.345Z``): how a time leaves
    relay (tool results, shell output, logs) and how stored entries spell it. Integer arithmetic
    (the proleptic Gregorian calendar), no ``datetime`` on the way."""
    if not 0 <= ms < _YEAR_10000_MS:
        return _spelled(from_ms(ms))
    second, millis = divmod(ms, 1000)
    return f"{_second_text(second)}.{millis:03d}Z"


@functools.lru_cache(maxsize=256)
def _second_text(second: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of a second since the epoch. Every send and fetch spells the current
    time (stored entries and the fetch script's dead-letter time are ISO text), and nearly all of
    them within the same few seconds: cached, the spelling costs 0.4 µs instead of 2.8."""
    days, rest = divmod(second, 86_400)
    year, month, day = _civil(days)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{year}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"


def format_time(moment: datetime) -> str:
    """``format_ms`` of a ``datetime`` (a naive one is read as local time)."""
    if moment.tzinfo is UTC and moment.year >= 1970:
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
_SECOND: Final = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)", re.ASCII)


def parse_ms(text: str) -> int:
    """The milliseconds since the epoch of ISO-8601 text (``format_ms``'s inverse); the exact form
    ``format_ms`` writes is read by integer arithmetic, any other by ``parse_time``."""
    if len(text) == 24 and text[19] == "." and text[23] == "Z" and text[20:23].isdigit():
        second = _second_of(text[:19])  # every envelope of a fetch names one of a few seconds
        if second is not None and text[20:23].isascii():
            return second * 1000 + int(text[20:23])
    return to_ms(parse_time(text))


@functools.lru_cache(maxsize=256)
def _second_of(text: str) -> int | None:
    """The second since the epoch of canonical ``YYYY-MM-DDTHH:MM:SS`` text; None for anything else."""
    found = _SECOND.fullmatch(text)
    if found is None:
        return None
    year, month, day, hour, minute, second = map(int, found.groups())
    if (
        1 <= month <= 12
        and 1 <= day <= _month_days(year, month)
        and hour < 24
        and minute < 60
        and second < 60
    ):
        return _days(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    return None


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01 (``days >= 0``; H. Hinnant's algorithm)."""
    z = days + 719_468
    era, doe = divmod(z, 146_097)
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a date (``_civil``'s inverse)."""
    year -= month <= 2
    era, yoe = divmod(year, 400)
    doy = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def parse_time(text: str) -> datetime:
    found = _CANONICAL.fullmatch(text)
    if found is None:  # not the exact form format_time writes: the general (slower) parser decides
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    year, month, day, hour, minute, second, millis = map(int, found.groups())
    return datetime(year, month, day, hour, minute, second, millis * 1000, tzinfo=UTC)
