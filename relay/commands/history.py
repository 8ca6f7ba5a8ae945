"""``relay history --agent ID ...`` and ``relay search WORDS ...``: what left agents' inboxes.

Both read the agents' history streams (``IOperatorView.history``): acknowledged, dead-lettered and
expired envelopes, kept for ``--history-retention`` (docs/history.md). Read-only. The time range
(when an envelope left its inbox) bounds what is read; every page reads at most the page plus
``HISTORY_SCAN`` entries of one history, and says where to go on (``--after``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import TYPE_CHECKING, Any, Final

from broker.agent_message import KIND_LABELS
from broker.envelope import format_ms
from broker.history import check_cursor
from broker.history import moment as history_moment
from broker.ids import check_agent_id
from broker.limits import MAX_FETCH_LIMIT
from broker.ports import Archived, HistoryPage, HistoryQuery
from broker.text import counted, escaped
from relay.commands import UsageError, bounded_int
from relay.settings import ShellSettings, add_options, load
from relay.shell import envelope_json, envelope_text, operator_view

if TYPE_CHECKING:
    from adapters.redis.operator_view import RedisOperatorView
    from relay.commands import Subparsers

ENDED: Final = "-"
"""The part of a ``--with`` cursor whose history was read to its end."""


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "history",
        help="show what left an agent's inbox (acknowledged, dead-lettered, expired)",
        description="Show agent --agent's history, oldest first: the envelopes it acknowledged and those "
        "dead-lettered or expired, with how and when each left its inbox. With --with ID, the "
        "conversation with ID: mail from ID in --agent's history and mail to ID in ID's. Read-only.",
    )
    parser.add_argument("--agent", required=True, metavar="ID", help="whose history, e.g. builder")
    parser.add_argument("--with", dest="peer", metavar="ID", help="only mail exchanged with agent ID")
    _range(parser)
    parser.add_argument("--kind", choices=sorted(KIND_LABELS.values()), help="only envelopes of this kind")
    parser.add_argument("--text", metavar="WORDS", help="only texts holding every word (any case, any order)")
    _paging(parser)
    parser.set_defaults(handler=_history)

    search = subparsers.add_parser(
        "search",
        help="find words in agents' histories",
        description="Show history entries whose text holds every one of WORDS (case-insensitive, whole "
        "words), in --agent's history or, without it, in every registered agent's. Read-only.",
    )
    search.add_argument("words", nargs="+", metavar="WORDS", help="words the text must hold")
    search.add_argument("--agent", metavar="ID", help="only this agent's history")
    _range(search)
    _paging(search)
    search.set_defaults(handler=_search)


def _range(parser: argparse.ArgumentParser) -> None:
    when = "ISO-8601 (2026-12-01T09:00:00Z, 2026-12-01) or an age (90s, 30m, 2h, 7d)"
    parser.add_argument("--since", metavar="T", help=f"left the inbox at or after T: {when}")
    parser.add_argument("--until", metavar="T", help=f"left the inbox at or before T: {when}")


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=bounded_int(1, MAX_FETCH_LIMIT),
        default=100,
        metavar="N",
        help=f"at most N entries per history, 1..{MAX_FETCH_LIMIT} (default 100)",
    )
    parser.add_argument("--after", metavar="CURSOR", help="continue after CURSOR (a page's `next`)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_options(parser, ShellSettings)


def moment(text: str | None, option: str, now: int) -> int | None:
    """The ms of ``--since``/``--until`` text (``broker.history.moment``); a usage error naming the
    option otherwise."""
    if text is None:
        return None
    try:
        return history_moment(text, now)
    except ValueError as exc:
        raise UsageError(f"{option} {exc}") from None


def _query(args: argparse.Namespace, now: int, **more: Any) -> HistoryQuery:
    since, until = moment(args.since, "--since", now), moment(args.until, "--until", now)
    if since is not None and until is not None and since > until:
        raise UsageError("--since is after --until: nothing can match")
    return HistoryQuery(since_ms=since, until_ms=until, **more)


def _words(text: str) -> tuple[str, ...]:
    found = tuple(re.findall(r"\w+", text))
    if not found:
        raise UsageError(f"{escaped(text)[:60]!r} holds no word to look for (letters, digits or _)")
    return found


def _history(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    agent = check_agent_id(args.agent, "--agent")
    peer = check_agent_id(args.peer, "--with") if args.peer is not None else None
    words = _words(args.text) if args.text is not None else ()
    cursors = _cursors(args.after, 2 if peer is not None else 1)

    async def run() -> tuple[list[Archived], list[str | None], int, int]:
        async with operator_view(settings, "history", agent=agent) as view:
            now = await view.now_ms()
            if peer is None:
                query = _query(args, now, kind=args.kind, words=words)
                page = await view.history(agent, query, args.limit, cursors[0])
                return page.entries, [page.next], page.read, now
            received = _query(args, now, sender=peer, kind=args.kind, words=words)
            sent = _query(args, now, sender=agent, kind=args.kind, words=words)
            pages = [
                await _page(view, agent, received, args.limit, cursors[0]),
                await _page(view, peer, sent, args.limit, cursors[1]),
            ]
            merged = sorted((e for p in pages for e in p.entries), key=lambda e: (e.archived_at_ms, e.cursor))
            return merged, [p.next for p in pages], sum(p.read for p in pages), now

    entries, nexts, read, now = asyncio.run(run())
    more = None if all(n is None for n in nexts) else ",".join(n or ENDED for n in nexts)
    return _show(args, f"history of {agent}" + (f" with {peer}" if peer else ""), entries, more, read, now)


async def _page(
    view: RedisOperatorView, agent: str, query: HistoryQuery, limit: int, after: str | None
) -> HistoryPage:
    if after == ENDED:
        return HistoryPage([], None, 0)
    return await view.history(agent, query, limit, after)


def _cursors(after: str | None, parts: int) -> list[str | None]:
    if after is None:
        return [None] * parts
    given = after.split(",")
    if len(given) != parts:
        raise UsageError(
            f"--after {escaped(after)[:80]!r} is not a cursor of this listing (use the `next` it printed)"
        )
    try:
        return [c if c == ENDED else check_cursor(c) for c in given]
    except ValueError as exc:
        raise UsageError(f"--after: {exc}") from None


def _search(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    agent = check_agent_id(args.agent, "--agent") if args.agent is not None else None
    words = _words(" ".join(args.words))
    cursors = _cursors(args.after, 1) if agent is not None else [None]
    if agent is None and args.after is not None:
        raise UsageError("--after pages one history: give --agent with it")

    async def run() -> tuple[list[Archived], str | None, int, int]:
        async with operator_view(settings, "search", agent=agent) as view:
            now = await view.now_ms()
            query = _query(args, now, words=words)
            if agent is not None:
                page = await view.history(agent, query, args.limit, cursors[0])
                return page.entries, page.next, page.read, now
            agents = await view.inspector.directory.agents()
            pages = [await view.history(a, query, args.limit) for a in agents]
            found = sorted((e for p in pages for e in p.entries), key=lambda e: (e.archived_at_ms, e.cursor))
            unread = [a for a, p in zip(agents, pages, strict=True) if p.next is not None]
            return found, (" ".join(unread) or None), sum(p.read for p in pages), now

    entries, more, read, now = asyncio.run(run())
    where = f"history of {agent}" if agent else "every history"
    return _show(
        args, f"search of {where} for {' '.join(words)!r}", entries, more, read, now, per_agent=agent is None
    )


def _show(
    args: argparse.Namespace,
    title: str,
    entries: list[Archived],
    more: str | None,
    read: int,
    now: int,
    *,
    per_agent: bool = False,
) -> int:
    if args.json:
        data: dict[str, Any] = {
            "time": format_ms(now),
            "entries": [archived_json(e) for e in entries],
            "read": read,
            "next": more,
        }
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0
    shown, cost = counted(len(entries), "entry", "entries"), counted(read, "entry", "entries")
    print(f"{title}: {shown}, oldest first ({cost} read)")
    for entry in entries:
        print()
        how = entry.outcome + (f" ({escaped(entry.reason)[:120]})" if entry.reason else "")
        print(envelope_text(entry.envelope, now))
        print(f"    {how} at {format_ms(entry.archived_at_ms)}")
    if more is not None:
        if per_agent:
            print(f"\nmore in the histories of {escaped(more)}: run it again with --agent ID")
        else:
            print(f"\nmore: run it again with --after {more}")
    return 0


def archived_json(entry: Archived) -> dict[str, Any]:
    return {
        **envelope_json(entry.envelope),
        "outcome": entry.outcome,
        "reason": entry.reason,
        "left_at": format_ms(entry.archived_at_ms),
        "cursor": entry.cursor,
    }
