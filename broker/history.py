"""An agent's history: the one definition of what a ``HistoryQuery`` matches, and of the walk that
answers ``IOperatorView.history`` on every backend.

The text match is case-insensitive on words: the query's words (letters, digits and ``_``, as
``WORD`` finds them) must each be a word of the text, in any order. The walk reads entries in the
time range in order and stops at the page or at ``HISTORY_SCAN`` entries beyond it, so a query that
matches little costs the same bounded read as one that matches much, and says where to go on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from broker.limits import HISTORY_SCAN
from broker.ports import Archived, HistoryPage, HistoryQuery

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
