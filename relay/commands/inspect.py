"""``relay inspect [AGENT] [--json]``: registrations and inboxes as Redis has them.

Per agent: registration (provider, endpoint, tier, session, age), inbox depth, pending count, age of
the oldest unacknowledged envelope, dead letters and last seen. Read-only; message text is never read out.
The queries live in ``adapters.redis.inspect``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from adapters.redis.inspect import AgentInspection, Report, report
from broker.envelope import parse_ms
from broker.ids import check_agent_id
from broker.text import counted, escaped
from relay.commands import bounded_int
from relay.settings import StoreSettings, add_options, load, store_named, store_url
from relay.shell import moment, unknown_agent

if TYPE_CHECKING:
    from relay.commands import Subparsers

DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
EXIT_NOT_FOUND = 1


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show agents' registrations, inbox backlog, pending and dead letters (from Redis)",
        description="Show what Redis holds for each registered agent (or just AGENT): its registration, "
        "inbox depth (unacknowledged envelopes), pending (handed out, not acknowledged), the age of the "
        "oldest unacknowledged envelope and its dead letters. Ages are measured against the Redis "
        "server's clock. Read-only; message text is never shown.",
    )
    parser.add_argument("agent", nargs="?", metavar="AGENT", help="one agent id (default: every agent)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N agents, by id (default {DEFAULT_LIMIT})",
    )
    add_options(parser, StoreSettings)
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    settings = load(StoreSettings, args)
    url = store_url(settings, "inspect")
    agent: str | None = args.agent
    if agent is not None:
        check_agent_id(agent, "AGENT")
    found = asyncio.run(report(url, agent=agent, limit=args.limit))
    if agent is not None and not found.agents[0].exists:
        print(f"relay: error: {unknown_agent(agent, found.indexed, store_named(settings, found.redis))}",
              file=sys.stderr)  # fmt: skip
        return EXIT_NOT_FOUND
    if args.json:
        print(json.dumps(_as_json(found), indent=2))
    else:
        print(_as_text(found, store_named(settings, found.redis), single=agent is not None))
    return 0


def _as_json(found: Report) -> dict[str, object]:
    return {
        "redis": found.redis,
        "time": found.time,
        "agents_registered": found.indexed,
        "agents": [a.to_json() for a in found.agents],
    }


def _as_text(found: Report, store: str, *, single: bool) -> str:
    now_ms = parse_ms(found.time)
    blocks = [_table(a, now_ms) for a in found.agents]
    if single:
        footer = f"read from {store} at {found.time}"
    elif not found.agents:
        footer = f"no agents registered at {store} ({found.time}); if relay serve uses another store, "
        footer += "pass its --data-dir or --redis-url"
    else:
        shown = len(found.agents)
        more = f"; showing the first {shown} by id (--limit)" if found.indexed > shown else ""
        footer = f"{counted(found.indexed, 'agent')} registered at {store} ({found.time}){more}"
    return "\n\n".join([*blocks, footer])


def _table(a: AgentInspection, now_ms: int) -> str:
    rows: list[tuple[str, str]] = []
    if a.registered:
        rows += [
            ("provider", a.provider or "-"),
            ("endpoint", a.endpoint or "-"),
            ("tier", a.tier or "-"),
            ("session", a.session or "-"),
            ("registered", f"{human_age(a.age_seconds)} ago, at {a.registered_at or '-'}"),
            ("updated at", a.updated_at or "-"),
        ]
    else:
        rows.append(("registration", "none (not registered)"))
    rows += [
        ("inbox depth", f"{a.inbox_depth} unacknowledged ({a.not_yet_fetched} not yet fetched)"),
        ("pending", f"{a.pending} handed out, not acknowledged"),
        (
            "oldest unacked",
            "- (inbox empty)"
            if a.oldest_unacked_seconds is None
            else f"{human_age(a.oldest_unacked_seconds)}, entry {a.oldest_unacked_entry}",
        ),
        ("dead letters", str(a.dead_letters)),
        ("last seen", moment(a.last_seen_ms, now_ms)),
        ("expired", f"{counted(a.expired, 'envelope')} expired unacknowledged (ever)"),
        (
            "poisoned",
            f"{counted(a.poisoned, 'envelope')} dead-lettered after --max-deliveries hand-outs (ever)",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    # values come from Redis, where anyone with access may have written anything: escaped
    lines = (f"  {label.ljust(width)}  {escaped(value)}" for label, value in rows)
    return "\n".join([escaped(a.agent), *lines])


def human_age(seconds: float | None) -> str:
    """``75.0 s (1m 15s)``; seconds first, then a readable breakdown past a minute."""
    if seconds is None:
        return "-"
    text = f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return text
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if hours or days:
        parts.append(f"{hours}h")
    parts += [f"{minutes}m", f"{secs}s"]
    return f"{text} ({' '.join(parts)})"
