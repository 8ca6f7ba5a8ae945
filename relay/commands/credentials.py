"""``relay credentials issue|list|revoke``: per-agent credentials, for operators.

A credential acts only as its agent (``broker.credentials``); agents exchange it at ``POST
/agent/token`` for short-lived tokens. These commands work on relay's store (``--redis-url``, or the
embedded server of the data dir), which only the operator reaches; the secret is printed once, by
``issue``, and stored nowhere but as its hash. Each issue and revocation is one audit log line on
stderr (``relay.credentials``, JSON) and a count of ``csf_relay_credentials_total{event}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import TYPE_CHECKING

from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.credentials import RedisCredentials
from broker.credentials import Audience, Credential, check_credential_id, new_credential, parse_duration
from broker.envelope import format_ms
from broker.errors import RelayError
from broker.ids import check_agent_id
from relay import logs
from relay.commands import UsageError
from relay.settings import StoreSettings, add_options, load, store_url
from relay.shell import table

if TYPE_CHECKING:
    from relay.commands import Subparsers

audit = logging.getLogger("relay.credentials")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "credentials",
        help="issue, list and revoke per-agent credentials (operators)",
        description="Per-agent credentials: each acts only as its agent and is exchanged by the agent's "
        "helper for short-lived tokens at /agent/token. They live in relay's store, which these commands "
        "read and write (the embedded server of the data dir, or --redis-url).",
    )
    commands = parser.add_subparsers(
        dest="credentials", metavar="COMMAND", required=True, parser_class=type(parser)
    )
    issue = commands.add_parser(
        "issue",
        help="issue a credential for one agent and print it (once)",
        description="Issue a credential that can act only as AGENT and print it on stdout, once: only its "
        "hash is stored. `relay setup claude-code` issues one and writes it to the agent's folder.",
    )
    issue.add_argument("--agent", required=True, help="the agent it acts as")
    issue.add_argument("--label", default="", help="what it is for, shown by `relay credentials list`")
    issue.add_argument(
        "--expires", metavar="DURATION", help="refuse it after this long, e.g. 30d, 12h (default: never)"
    )
    issue.add_argument(
        "--network",
        action="store_true",
        help="for the network listener (relay serve --network-port) instead of the loopback one",
    )
    listing = commands.add_parser("list", help="list credentials (never their secrets)")
    listing.add_argument("--agent", help="only this agent's")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    revoke = commands.add_parser(
        "revoke",
        help="revoke a credential (or every credential of an agent)",
        description="Revoke credential ID, or with --agent every credential of that agent: the next "
        "exchange is refused (revoked), and tokens minted from it stop within seconds.",
    )
    revoke.add_argument("id", nargs="?", metavar="ID", help="the credential id (cr_...)")
    revoke.add_argument("--agent", help="revoke every credential of this agent")
    for each in (issue, listing, revoke):
        add_options(each, StoreSettings)
    issue.set_defaults(handler=_issue)
    listing.set_defaults(handler=_list)
    revoke.set_defaults(handler=_revoke)


def store_for(settings: StoreSettings, command: str) -> RedisCredentials:
    """The credential store of the relay ``settings`` name (``SettingsError`` when none runs)."""
    return RedisCredentials(RedisConnection(RedisSettings(url=store_url(settings, command))))


def issue_credential(
    store: RedisCredentials, agent: str, *, label: str = "", expires: str | None = None, network: bool = False
) -> tuple[Credential, str]:
    """Issue and store a credential: its record and its text (``<id>.<secret>``); the audit line
    names its id, never the secret."""
    check_agent_id(agent, "--agent")
    audience: Audience = "network" if network else "loopback"
    seconds = parse_duration(expires) if expires is not None else None
    record, text = new_credential(
        agent, label=label, audience=audience, now_ms=int(time.time() * 1000), expires_in_s=seconds
    )

    async def run() -> None:
        try:
            await store.add(record)
        finally:
            await store.connection.close()

    asyncio.run(run())
    audit.info(
        "credential issued",
        extra={"event": "issued", "agent": agent, "credential": record.id, "listener": audience},
    )
    return record, text


def revoke_credentials(store: RedisCredentials, ids: list[str] | None, agent: str | None) -> list[Credential]:
    """Revoke ``ids`` (or every credential of ``agent``); the records as stored after."""

    async def run() -> list[Credential]:
        try:
            wanted = ids if ids is not None else [c.id for c in await store.listed(agent)]
            now_ms = int(time.time() * 1000)
            done = []
            for ident in wanted:
                record = await store.revoke(ident, now_ms)
                if record is None:
                    raise RelayError(f"no credential {ident}; see `relay credentials list`")
                done.append(record)
            return done
        finally:
            await store.connection.close()

    done = asyncio.run(run())
    for record in done:
        audit.info(
            "credential revoked",
            extra={
                "event": "revoked",
                "agent": record.agent,
                "credential": record.id,
                "listener": record.audience,
            },
        )
    return done


def _issue(args: argparse.Namespace) -> int:
    logs.audit_lines()
    store = store_for(load(StoreSettings, args), "credentials issue")
    record, text = issue_credential(
        store, args.agent, label=args.label, expires=args.expires, network=args.network
    )
    until = f"until {format_ms(record.expires_at_ms)}" if record.expires_at_ms else "with no expiry"
    print(
        f"relay: issued credential {record.id} for agent {record.agent} ({record.audience} listener, "
        f"{until}); it is shown once, below: keep it in a mode-0600 file",
        file=sys.stderr,
    )
    print(text)
    return 0


def _list(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "--agent") if args.agent is not None else None
    store = store_for(load(StoreSettings, args), "credentials list")

    async def run() -> list[Credential]:
        try:
            return await store.listed(agent)
        finally:
            await store.connection.close()

    found = asyncio.run(run())
    if args.json:
        for record in found:
            print(json.dumps(record.public()))
        return 0
    if not found:
        print("no credentials" + (f" for agent {agent}" if agent else ""))
        return 0
    now_ms = int(time.time() * 1000)

    def when(ms: int | None) -> str:
        return "-" if ms is None else format_ms(ms)

    rows = [
        (
            c.id,
            c.agent,
            c.audience,
            "revoked" if c.revoked else ("expired" if c.expired(now_ms) else "active"),
            when(c.created_at_ms),
            when(c.last_used_at_ms),
            when(c.expires_at_ms),
            c.label,
        )
        for c in found
    ]
    print(table(("ID", "AGENT", "LISTENER", "STATE", "CREATED", "LAST USED", "EXPIRES", "LABEL"), rows))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.agent is None):
        raise UsageError("give a credential ID or --agent ID (every credential of that agent), not both")
    ids = [check_credential_id(args.id, "ID")] if args.id is not None else None
    agent = check_agent_id(args.agent, "--agent") if args.agent is not None else None
    logs.audit_lines()
    done = revoke_credentials(store_for(load(StoreSettings, args), "credentials revoke"), ids, agent)
    if not done:
        print(f"relay: agent {agent} has no credentials; nothing revoked")
        return 0
    for record in done:
        print(f"revoked {record.id} (agent {record.agent}); its next exchange is refused (revoked)")
    return 0
