"""The dashboard's history and search under ``/ui/api``: what left agents' inboxes, as ``relay history``
and ``relay search`` show it (docs/history.md), a page at a time.

``/api/history?agent=ID[&with=ID][&since=T][&until=T][&kind=K][&text=WORDS][&limit=N][&after=C]``:
``agent``'s history (with ``with``: the conversation, mail from that agent in ``agent``'s history and
mail from ``agent`` in its). ``/api/search?words=WORDS[&agent=ID][&since=T][&until=T][&limit=N]
[&after=C]``: ``agent``'s history, or every registered agent's, for entries whose text holds every
word. Both read through ``broker.history.merged``: each history once per page, at most the page plus
``HISTORY_SCAN`` entries of it, in the time range only; ``next`` is the cursor of the page after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from starlette.requests import Request
from starlette.routing import Route

from broker import schemas
from broker.agent_message import KIND_LABELS
from broker.envelope import format_ms
from broker.errors import InvalidArgument
from broker.front.ui.api import Caller, Dashboard, _envelope, _int, json_endpoint
from broker.history import agent_mail, mail_cursor, merged, moment, words
from broker.ids import check_agent_id
from broker.mail_search import everyone
from broker.ports import Archived, HistoryQuery

HISTORY_PAGE: Final = 50
MAX_HISTORY_PAGE: Final = 200
KINDS: Final = frozenset(KIND_LABELS.values())


def routes(dashboard: Dashboard, session_of: Callable[[Request], Caller]) -> list[Route]:
    views = _HistoryViews(dashboard)
    return [
        Route("/api/history", json_endpoint(session_of, views.history), methods=["GET"]),
        Route("/api/search", json_endpoint(session_of, views.search), methods=["GET"]),
    ]


def entry_json(entry: Archived) -> dict[str, object]:
    """One history entry: the envelope as the inbox showed it, and how and when it left the inbox."""
    return {
        **_envelope(entry.envelope),
        "outcome": entry.outcome,
        "reason": entry.reason,
        "left_at": format_ms(entry.archived_at_ms),
    }


class _HistoryViews:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self._everywhere = asyncio.Lock()
        """One search of every agent's history at a time in this process (each reads every history)."""

    async def history(self, request: Request, caller: Caller) -> object:
        params = request.query_params
        agent = check_agent_id(params.get("agent"), "agent")
        peer = _agent(request, "with")
        kind = params.get("kind") or None
        if kind is not None and kind not in KINDS:
            raise InvalidArgument("kind", "kind.label", f"must be one of {sorted(KINDS)}")
        text = params.get("text") or None
        found = _words(text, "text") if text is not None else ()
        query = await self._range(request, sender=peer, kind=kind, words=found)
        limit, after = self._page(request)
        mail = await agent_mail(self.d.view, agent, [peer] if peer is not None else [], query, limit, after)
        entries = [entry_json(e) for e in mail.entries]
        return {"agent": agent, "with": peer, "entries": entries, "next": mail.next}

    async def search(self, request: Request, caller: Caller) -> object:
        found = _words(request.query_params.get("words", ""), "words")
        agent = _agent(request, "agent")
        query = await self._range(request, words=found)
        limit, after = self._page(request)
        if agent is not None:
            mail = await merged(self.d.view, [(agent, query)], limit, after)
        else:
            async with self._everywhere:
                holders = await everyone(self.d.relay)
                mail = await merged(self.d.view, [(holder, query) for holder in holders], limit, after)
        return {
            "words": list(found),
            "agent": agent,
            "entries": [entry_json(e) for e in mail.entries],
            "next": mail.next,
        }

    async def _range(
        self,
        request: Request,
        *,
        words: tuple[str, ...],
        sender: str | None = None,
        kind: str | None = None,
    ) -> HistoryQuery:
        """The query of the time range ``since``..``until`` (ISO-8601 or an age, as ``relay history``
        takes them, by the store's clock), ``sender``, ``kind`` and ``words``."""
        params = request.query_params
        given = {name: params.get(name) or None for name in ("since", "until")}
        now = await self.d.view.now_ms() if any(given.values()) else 0
        times: dict[str, int | None] = {}
        for name, text in given.items():
            try:
                times[name] = None if text is None else moment(text[:64], now)
            except ValueError as exc:
                raise InvalidArgument(name, "time", str(exc)) from None
        since, until = times["since"], times["until"]
        if since is not None and until is not None and since > until:
            raise InvalidArgument("since", "since.order", "is after until: nothing can match")
        return HistoryQuery(since_ms=since, until_ms=until, sender=sender, kind=kind, words=words)

    def _page(self, request: Request) -> tuple[int, str | None]:
        limit = _int(request, "limit", HISTORY_PAGE, 1, MAX_HISTORY_PAGE)
        after = request.query_params.get("after") or None
        if after is not None:
            try:
                mail_cursor(after)
            except ValueError:
                raise InvalidArgument(
                    "after", "cursor", "must be a cursor this listing gave (its next page link)"
                ) from None
        return limit, after


def _agent(request: Request, name: str) -> str | None:
    text = request.query_params.get(name) or None
    return None if text is None else check_agent_id(text, name)


def _words(text: str, name: str) -> tuple[str, ...]:
    found = words(text[: schemas.MAX_SEARCH_QUERY])
    if not found:
        raise InvalidArgument(name, f"{name}.words", "holds no word to look for (letters, digits or _)")
    return found
