"""The calling convention of the inbox scripts (``lua/fetch.lua``, ``sweep.lua``, ``ack.lua``,
``status_index.lua``, ``status.lua``, ``notice.lua``): the one place their KEYS and ARGV are built, in
the order each script names them at its top, and their replies read (``adapters/redis/protocol.py``
does the same for a send)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adapters.redis.connection import RedisSettings
from adapters.redis.keys import GROUP, Keys
from adapters.redis.protocol import Arg, Call
from broker.envelope import format_ms

Dropped = list[tuple[str, str]]
"""(tier label, reason) of each entry a script moved to the dead letters."""


@dataclass(frozen=True, slots=True)
class HistoryRule:
    """What the archiving scripts keep in an agent's history: ``retention_ms`` (0 = keep none) and
    ``max_bytes`` (0 = no cap; see ``entry_archive`` in ``lua/_entry.lua``). Two ARGV, in this order."""

    retention_ms: int
    max_bytes: int = 0

    @classmethod
    def of(cls, settings: RedisSettings) -> HistoryRule:
        return cls(settings.history_retention_ms, settings.history_max_bytes)


def _pairs(reply: object) -> Dropped:
    if not isinstance(reply, list):
        return []
    return [(str(reply[i]), str(reply[i + 1])) for i in range(0, len(reply) - 1, 2)]


def _dead_letter_keys(keys: Keys, agent: str, outcomes: str) -> list[str]:
    """The KEYS ``fetch.lua`` and ``sweep.lua`` move an entry to the dead letters with, in their order:
    inbox, dead letters, outcome hash, counts hash, history, history positions."""
    return [
        keys.inbox(agent),
        keys.dead_letters(agent),
        outcomes,
        keys.delivery_counts(agent),
        keys.history(agent),
        keys.history_positions(agent),
    ]


def fetch_call(
    keys: Keys,
    agent: str,
    session: str | None,
    limit: int,
    *,
    now: int,
    max_deliveries: int,
    outcomes: str,
    until: int,
    keep: HistoryRule,
) -> Call:
    """``keep``: what the history keeps (``HistoryRule``), as for every call below."""
    return Call(
        [keys.registration(agent), *_dead_letter_keys(keys, agent, outcomes), keys.retired(agent)],
        [
            session or "",
            GROUP,
            agent,
            limit,
            now,
            max_deliveries,
            format_ms(now),
            until,
            keep.retention_ms,
            keep.max_bytes,
        ],
    )


@dataclass(frozen=True, slots=True)
class Fetch:
    """``fetch.lua``'s reply: the rows handed out (``entries.rows`` reads them) and the dead-lettered."""

    rows: object
    dropped: Dropped

    @classmethod
    def read(cls, reply: Sequence[object]) -> Fetch:
        rows, dropped = reply
        return cls(rows, _pairs(dropped))


def sweep_call(
    keys: Keys, agent: str, *, now: int, outcomes: str, until: int, limit: int, keep: HistoryRule
) -> Call:
    return Call(
        _dead_letter_keys(keys, agent, outcomes),
        [GROUP, now, format_ms(now), until, limit, keep.retention_ms, keep.max_bytes],
    )


def read_swept(reply: object) -> Dropped:
    """``sweep.lua``'s reply: tier label and reason of each entry moved."""
    return _pairs(reply)


def ack_call(
    keys: Keys,
    agent: str,
    session: str | None,
    entries: Sequence[tuple[str, str]],
    *,
    outcomes: str,
    until: int,
    keep: HistoryRule,
) -> Call:
    """``entries``: (stream entry id, nonce) of each envelope (``entries.entry_id``)."""
    args: list[Arg] = [session or "", GROUP, until, keep.retention_ms, keep.max_bytes]
    for pair in entries:
        args += pair
    return Call(
        [
            keys.registration(agent),
            keys.inbox(agent),
            outcomes,
            keys.history(agent),
            keys.history_positions(agent),
            keys.retired(agent),
        ],
        args,
    )


def read_acked(reply: Sequence[object]) -> list[tuple[str, str] | None]:
    """``ack.lua``'s reply: per envelope (sender, tier label) when acknowledged, None when unknown."""
    return [(str(one[0]), str(one[1])) if isinstance(one, list) else None for one in reply]


def status_index_call(
    keys: Keys, sender: str, session: str | None, lookups: Sequence[tuple[str, Sequence[int]]]
) -> Call:
    """``lookups``: per envelope its nonce and the days its send may be noted under."""
    call_keys = [keys.registration(sender), keys.retired(sender)]
    positions: dict[int, int] = {}
    args: list[Arg] = [session or ""]
    for nonce, days in lookups:
        args += (nonce, _positions(days, positions, call_keys, lambda day: keys.sent_index(sender, day)))
    return Call(call_keys, args)


def read_noted(reply: Sequence[object]) -> list[tuple[str, int] | None]:
    """``status_index.lua``'s reply: per envelope (recipient, sent_at ms), None when not noted."""
    out: list[tuple[str, int] | None] = []
    for value in reply:
        to, _, sent_at = str(value).partition(" ")
        out.append((to, int(sent_at)) if value else None)
    return out


def status_call(
    keys: Keys, to: str, *, now: int, hops: int, lookups: Sequence[tuple[tuple[str, str], Sequence[int]]]
) -> Call:
    """``lookups``: per envelope its (stream entry id, nonce) and the days of its outcome record,
    newest first."""
    call_keys = [keys.inbox(to)]
    positions: dict[int, int] = {}
    args: list[Arg] = [GROUP, now, hops]
    for entry, days in lookups:
        args += (*entry, _positions(days, positions, call_keys, lambda day: keys.outcomes(to, day)))
    return Call(call_keys, args)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One envelope of ``status.lua``'s reply."""

    state: str
    deliveries: int | None
    reason: str | None

    @classmethod
    def read_all(cls, reply: Sequence[Sequence[object]]) -> list[Outcome]:
        out = []
        for state, deliveries, reason in reply:
            count = int(str(deliveries))
            out.append(cls(str(state), count if count >= 0 else None, str(reason) or None))
        return out


def _positions(
    days: Sequence[int], positions: dict[int, int], call_keys: list[str], key: Callable[[int], str]
) -> str:
    """The KEYS positions of ``days`` as "<i> <j> ..."; a day not among ``call_keys`` yet is added."""
    for day in days:
        if day not in positions:
            call_keys.append(key(day))
            positions[day] = len(call_keys)
    return " ".join(str(positions[day]) for day in days)


def notice_call(
    keys: Keys, agent: str, session: str, *, remind: int, listed: int, most: int, seen: bool
) -> Call:
    """``remind``: ms after the last notice a reminder is due (0: never); ``seen``: the agent's own
    wait (its last seen moves), not a webhook notification's read."""
    return Call(
        [keys.registration(agent), keys.inbox(agent), keys.notice(agent), keys.retired(agent)],
        [session, remind, listed, most, 1 if seen else 0],
    )


@dataclass(frozen=True, slots=True)
class Announcement:
    """``notice.lua``'s reply; ``due_ms`` is None when no reminder is pending."""

    count: int
    unacknowledged: int
    reminder: bool
    due_ms: int | None
    rows: Sequence[Sequence[object]]

    @classmethod
    def read(cls, reply: Sequence[object]) -> Announcement:
        count, unacknowledged, reminder, due_ms, rows = reply
        due = int(str(due_ms))
        return cls(
            int(str(count)),
            int(str(unacknowledged)),
            bool(int(str(reminder))),
            due if due >= 0 else None,
            rows if isinstance(rows, list) else [],
        )


def purge_call(keys: Keys, agent: str, *, upto: str, batch: int, outcomes: str, until: int) -> Call:
    """``upto``: the newest entry id to drop (``+``: all)."""
    return Call([keys.inbox(agent), outcomes], [GROUP, upto, batch, until])


def read_purged(reply: Sequence[object]) -> tuple[int, bool]:
    """``purge.lua``'s reply: envelopes dropped, and whether more may be left."""
    dropped, more = reply
    return int(str(dropped)), bool(int(str(more)))
