"""``relay agents [--json]``: every registered agent with its backlog, from the Redis relay serve uses.

Per agent: id, provider, tier, session, inbox depth, pending (handed out, not acknowledged), the age
of the oldest unacknowledged envelope, dead letters and when it was last seen. Bounded work per agent
(``adapters.redis.operator_view``): no envelope is read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from broker.envelope import format_ms
from broker.ports import AgentOverview, AgentsPage
from broker.presence import presence
from broker.text import counted, escaped, shown
from relay.commands import bounded_int, lifecycle
from relay.settings import ShellSettings, add_options, load
from relay.shell import brief, operator_view, table

if TYPE_CHECKING:
    from relay.commands import Subparsers

DEFAULT_LIMIT = 10_000
MAX_LIMIT = 1_000_000
COLUMNS = (
    "AGENT",
    "PROVIDER",
    "TIER",
    "SESSION",
    "INBOX",
    "PENDING",
    "OLDEST",
    "DEAD",
    "PRESENCE",
    "LAST SEEN",
)


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "agents",
        help="list registered agents with their inbox backlog and when they were last seen",
        description="List every registered agent: id, provider, tier, session, inbox depth "
        "(unacknowledged envelopes), pending (handed out, not acknowledged), age of the oldest "
        "unacknowledged envelope, dead letters, presence (live: a sign of its session within the "
        "presence window; gone: none) and last seen (its last registration, fetch, acknowledgement, "
        "mail-pending wait or webhook answered). Times are measured against the Redis server's "
        "clock. Read-only. `relay agents retire ID` ends a registration.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N agents, by id (default {DEFAULT_LIMIT})",
    )
    add_options(parser, ShellSettings)
    parser.set_defaults(handler=_agents)
    actions = parser.add_subparsers(dest="agents_action", metavar="ACTION", parser_class=type(parser))
    lifecycle.add_retire(actions)


def _agents(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)

    async def run() -> AgentsPage:
        async with operator_view(settings, "agents") as view:
            return await view.agents(args.limit)

    page = asyncio.run(run())
    if args.json:
        print(json.dumps(as_json(page), indent=2))
        return 0
    print(as_text(page))
    return 0


def agent_json(a: AgentOverview, now_ms: int) -> dict[str, object]:
    """One agent of ``relay agents --json`` (the dashboard shows the same fields)."""
    return {
        "agent": a.agent,
        "provider": a.provider,
        "endpoint": a.endpoint,
        "tier": a.tier.label if a.tier is not None else None,
        "session": a.session,
        "inbox_depth": a.inbox_depth,
        "pending": a.pending,
        "oldest_unacked_at": None if a.oldest_unacked_ms is None else format_ms(a.oldest_unacked_ms),
        "oldest_unacked_seconds": _seconds(a.oldest_unacked_ms, now_ms),
        "dead_letters": a.dead_letters,
        "presence": presence(a.last_seen_ms, now_ms, a.ended_at_ms),
        "last_seen": None if a.last_seen_ms is None else format_ms(a.last_seen_ms),
        "last_seen_seconds_ago": _seconds(a.last_seen_ms, now_ms),
    }


def as_json(page: AgentsPage) -> dict[str, object]:
    return {
        "time": format_ms(page.now_ms),
        "registered": page.total,
        "agents": [agent_json(a, page.now_ms) for a in page.agents],
    }


def as_text(page: AgentsPage) -> str:
    now = page.now_ms
    if not page.agents:
        return f"no agents registered ({format_ms(now)})"
    rows = [
        (
            escaped(a.agent),
            escaped(a.provider or "-"),
            a.tier.label if a.tier is not None else "-",
            shown(a.session or "-", 24),
            str(a.inbox_depth),
            str(a.pending),
            brief(a.oldest_unacked_ms, now),
            str(a.dead_letters),
            presence(a.last_seen_ms, now, a.ended_at_ms),
            brief(a.last_seen_ms, now),
        )
        for a in page.agents
    ]
    listed = len(page.agents)
    more = f"; showing the first {listed} by id (--limit)" if page.total > listed else ""
    return (
        f"{table(COLUMNS, rows)}\n\n{counted(page.total, 'agent')} registered, as of {format_ms(now)}{more}"
    )


def _seconds(ms: int | None, now_ms: int) -> float | None:
    return None if ms is None else max(0.0, (now_ms - ms) / 1000)
