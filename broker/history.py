"""An agent's history: the one definition of what a ``HistoryQuery`` matches, and of the walk that
answers ``IOperatorView.history`` on every backend.

The text match is case-insensitive on words: the query's words (letters, digits and ``_``, as
``WORD`` finds them) must each be a word of the text, in any order. The walk reads entries in the
time range in order and stops at the page or at ``HISTORY_SCAN`` entries beyond it, so a query that
matches little costs the same bounded read as one that matches much, and says where to go on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final

from broker.envelope import format_ms, to_ms
from broker.ids import decode_envelope_id
from broker.limits import HISTORY_SCAN
from broker.ports import Archived, HistoryPage, HistoryQuery, IOperatorView
from broker.text import escaped

WORD: Final = re.compile(r"\w+")


def words(text: str) -> tuple[str, ...]:
    """The words of ``text``, case-folded, in order."""
    return tuple(w.casefold() for w in WORD.findall(text))


def matches(entry: Archived, query: HistoryQuery) -> bool:
    """Whether ``entry`` is one ``query`` asks for (the time range is the walk's, not checked here)."""
    envelope = entry.envelope
    if query.sender is not None and envelope.sender != query.sender:
        return False
    if query.kind is not None and envelope.fields.get("kind") != query.kind:
        return False
    if query.words:
        present = set(words(envelope.fields.get("text", "")))
        return all(w.casefold() in present for w in query.words)
    return True


def entry_bytes(entry: Archived) -> int:
    """What ``entry`` counts against a history's byte cap: the UTF-8 bytes of the names and values
    of the fields it is stored with (``entry_archive`` in ``lua/_entry.lua`` sums the same)."""
    envelope = entry.envelope
    ms, seq, nonce = decode_envelope_id(envelope.envelope_id)
    fields: dict[str, str] = {
        "from": envelope.sender,
        "tier": envelope.tier.label,
        "sent_at": format_ms(envelope.sent_at_ms),
        **({"expires_at": str(envelope.expires_at_ms)} if envelope.expires_at_ms is not None else {}),
        **envelope.fields,
        **({"requeued_from": " ".join(envelope.requeued_from)} if envelope.requeued_from else {}),
        "nonce": nonce,
        "entry_id": f"{ms}-{seq}",
        "attempts": str(envelope.deliveries),
        "outcome": entry.outcome,
        **({"reason": entry.reason} if entry.reason is not None else {}),
    }
    return sum(len(k.encode()) + len(v.encode("utf-8", "surrogatepass")) for k, v in fields.items())


class Walk:
    """The page that ``query`` asks for, fed the entries of the range in order (already past the
    cursor): at most ``limit`` matches, after reading at most ``limit + budget`` entries. ``feed``
    answers False once the page is complete; ``done`` says the range ended, ``page()`` answers."""

    def __init__(self, query: HistoryQuery, limit: int, budget: int = HISTORY_SCAN) -> None:
        self.query, self.limit, self.most = query, limit, limit + budget
        self.found: list[Archived] = []
        self.read = 0
        self.last: str | None = None
        self.stopped = False

    def feed(self, entry: Archived) -> bool:
        if self.read >= self.most or len(self.found) >= self.limit:
            self.stopped = True
            return False
        self.read += 1
        self.last = entry.cursor
        if matches(entry, self.query):
            self.found.append(entry)
        return True

    def wants(self) -> int:
        """Entries worth reading next (one more than the page needs tells whether the range goes on):
        without a filter every entry matches, so no more than the page is read."""
        q = self.query
        if q.sender is None and q.kind is None and not q.words:
            return self.limit - len(self.found) + 1
        return self.most - self.read + 1

    def page(self) -> HistoryPage:
        """The answer: ``next`` is set when the walk stopped before the range ended."""
        return HistoryPage(self.found, self.last if self.stopped else None, self.read)


def page(entries: Iterable[Archived], query: HistoryQuery, limit: int) -> HistoryPage:
    """The page of ``entries`` (the whole range in order, past the cursor) ``query`` asks for."""
    walk = Walk(query, limit)
    for entry in entries:
        if not walk.feed(entry):
            break
    return walk.page()


CURSOR: Final = re.compile(r"\A[0-9]{1,16}-[0-9]{1,20}\Z")
"""A history cursor (``Archived.cursor``): milliseconds and a sequence number."""


def check_cursor(cursor: str) -> str:
    """``cursor`` when it is one ``IOperatorView.history`` handed out; else ``ValueError`` saying so."""
    if not CURSOR.match(cursor):
        raise ValueError(
            f"cursor {cursor[:40]!r} is not a history cursor (as a page's `next` gives: <ms>-<n>)"
        )
    return cursor


@dataclass(frozen=True, slots=True)
class Mail:
    """What ``agent_mail`` answers: the caller's mail, oldest first, and the cursor of the next page
    (None: nothing more)."""

    entries: list[Archived]
    next: str | None


MAIL_CURSOR: Final = re.compile(r"\A([0-9]{1,16})-([0-9]{1,20})@([a-z0-9][a-z0-9._-]{0,63})\Z")
"""A ``SearchAgentMessages`` cursor: the last entry's history position and the agent whose history
holds it (``<ms>-<n>@<agent>``)."""


def _order(entry: Archived) -> tuple[int, int, str]:
    ms, _, seq = entry.cursor.partition("-")
    return int(ms), int(seq), entry.envelope.to


def mail_cursor(cursor: str) -> tuple[int, int, str]:
    """The order key of a ``SearchAgentMessages`` cursor; ``ValueError`` when it is not one."""
    found = MAIL_CURSOR.match(cursor)
    if found is None:
        raise ValueError(f"cursor {cursor[:40]!r} is not one a SearchAgentMessages page gave (next)")
    return int(found.group(1)), int(found.group(2)), found.group(3)


def _after(
    query: HistoryQuery, holder: str, start: tuple[int, int, str] | None
) -> tuple[HistoryQuery, str | None]:
    """Where ``holder``'s history is read from for the page after ``start``: past the position itself
    in the history it is of (and those of agents ordered before it), from it in the others."""
    if start is None:
        return query, None
    ms, seq, of = start
    if holder <= of:
        return query, f"{ms}-{seq}"
    if seq > 0:
        return query, f"{ms}-{seq - 1}"
    return replace(query, since_ms=max(query.since_ms or 0, ms)), None


async def agent_mail(
    view: IOperatorView,
    agent: str,
    others: Sequence[str],
    query: HistoryQuery,
    limit: int,
    after: str | None = None,
) -> Mail:
    """Mail ``agent`` received (its own history, from ``query.sender`` when set) or sent (the histories
    of ``others``, only entries whose sender is ``agent``), in the history order of (time it left the
    inbox, position, holder), at most ``limit``, after the cursor ``after``. Nothing of another
    agent's mail is returned or counted: every history other than ``agent``'s own is read with
    ``sender = agent``, and what was read is not reported. Each history is read once per page
    (``IOperatorView.history``: at most the page plus ``HISTORY_SCAN`` entries each)."""
    sent = replace(query, sender=agent)
    asks = [(agent, query), *((other, sent) for other in others if other != agent)]
    return await merged(view, asks, limit, after)


async def merged(
    view: IOperatorView,
    asks: Sequence[tuple[str, HistoryQuery]],
    limit: int,
    after: str | None = None,
) -> Mail:
    """The entries of several histories (``asks``: each holder's history and what is asked of it) as one
    listing in the order of (time it left the inbox, position, holder), at most ``limit``, after the
    cursor ``after`` (a ``MAIL_CURSOR``). Each history is read once per page, at most the page plus
    ``HISTORY_SCAN`` entries of it; a cursor stops where every history was read at least as far."""
    start = mail_cursor(after) if after is not None else None
    found: list[Archived] = []
    stops: list[tuple[int, int, str]] = []
    for holder, asked in asks:
        # one more than the page per history: whether it goes on
        asked, position = _after(asked, holder, start)
        page = await view.history(holder, asked, limit + 1, position)
        found += [e for e in page.entries if start is None or _order(e) > start]
        if page.next is not None:  # this history was read up to page.next only
            ms, _, seq = page.next.partition("-")
            stops.append((int(ms), int(seq), holder))
    found.sort(key=_order)
    bound = min(stops) if stops else None  # every history was read at least this far
    if bound is not None:
        found = [e for e in found if _order(e) <= bound]
    if len(found) > limit:
        found = found[:limit]
        bound = _order(found[-1])
    return Mail(found, None if bound is None else f"{bound[0]}-{bound[1]}@{bound[2]}")


_AGO: Final = re.compile(r"\A([0-9]{1,9})([smhd])\Z")
_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def moment(text: str, now: int) -> int:
    """The ms a ``since``/``until`` given by a person means: an age before ``now`` (``90s``, ``30m``,
    ``2h``, ``7d``) or an ISO-8601 time (UTC unless it names a zone); ``ValueError`` otherwise."""
    ago = _AGO.match(text)
    if ago is not None:
        return now - int(ago.group(1)) * _UNIT_MS[ago.group(2)]
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{escaped(text)[:60]!r} is neither ISO-8601 (2026-12-01T09:00:00Z) nor an age (30m, 2h, 7d)"
        ) from None
    return to_ms(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC))
