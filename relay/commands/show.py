"""``relay show ENVELOPE_ID [--agent AGENT] [--json]``: from an ``env_…`` id in a log line to the
stream entry in Redis.

Prints sender, recipient, tier, state (queued, delivered, dead_lettered; an acknowledged envelope is
deleted, so it is not found), deliveries, the stream key and entry id, and a ``redis-cli`` line that
reads the entry. Read-only; message text is never shown. The search is in ``adapters.redis.locate``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.directory import Directory
from adapters.redis.inspect import redacted
from adapters.redis.keys import DEFAULT_PREFIX
from adapters.redis.locate import Located, locate
from broker.errors import BackendUnavailable, InvalidArgument
from broker.ids import check_agent_id, is_envelope_id
from broker.text import counted, escaped, shown
from relay.settings import StoreSettings, add_options, load, store_named, store_url

if TYPE_CHECKING:
    from relay.commands import Subparsers

EXIT_NOT_FOUND = 1


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "show",
        help="show where one envelope is: sender, recipient, state, deliveries, stream entry",
        description="Find the envelope ENVELOPE_ID (as logs and tools show it, env_...) in Redis and "
        "show its sender, recipient, tier, state (queued: not yet fetched; delivered: handed out, not "
        "acknowledged; dead_lettered), deliveries and its stream key and entry id. An acknowledged "
        "envelope has left the inbox and is not found here (`relay history --agent ID` shows it). "
        "Read-only; message text is never shown.",
    )
    parser.add_argument("envelope_id", metavar="ENVELOPE_ID", help="e.g. env_01M8KRCX7B000000FKVMRW9PAP")
    parser.add_argument("--agent", metavar="AGENT", help="look only in this recipient's streams (faster)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_options(parser, StoreSettings)
    parser.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"the relay's Redis key prefix (default {DEFAULT_PREFIX})"
    )
    parser.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    envelope_id: str = args.envelope_id
    if not is_envelope_id(envelope_id):
        raise InvalidArgument(
            "ENVELOPE_ID",
            "envelope_id.pattern",
            f"{shown(envelope_id)!r} is not an envelope id (env_ followed by 26 base32 characters); copy it "
            "from a log line or a tool result",
        )
    agents = None if args.agent is None else [check_agent_id(args.agent, "--agent")]
    settings = load(StoreSettings, args)
    url = store_url(settings, "show")
    found, registered = asyncio.run(_locate(url, args.prefix, envelope_id, agents))
    store = store_named(settings, redacted(url))
    if args.json:
        print(json.dumps({"redis": redacted(url), **found.to_json()}, indent=2))
    elif found.where != "nowhere":
        print(_as_text(found, store))
    if found.where == "nowhere" and not args.json:
        searched = f"{args.agent}'s inbox or dead letters" if args.agent else "any inbox or dead-letter list"
        hint = (
            "; the store holds no agent at all: is it the one relay serve uses? (pass --data-dir or "
            "--redis-url to name that one)"
            if registered == 0
            else ""
        )
        print(
            f"relay: error: envelope {envelope_id} (stream entry {found.entry_id}) is not in {searched} at "
            f"{store}: it was acknowledged (`relay history --agent ID` shows what left an inbox), or "
            f"never stored there{hint}",
            file=sys.stderr,
        )
    return EXIT_NOT_FOUND if found.where == "nowhere" else 0


async def _locate(url: str, prefix: str, envelope_id: str, agents: list[str] | None) -> tuple[Located, int]:
    settings = RedisSettings(url=url, prefix=prefix, command_timeout=5.0, connect_timeout=2.0)
    connection = RedisConnection(settings)
    await connection.open()
    try:
        everyone = await Directory(connection).agents()
        return await locate(connection, envelope_id, agents if agents is not None else everyone), len(
            everyone
        )
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"cannot read Redis at {redacted(url)} ({exc.message})") from exc
    finally:
        await connection.close()


def _as_text(found: Located, store: str) -> str:
    deliveries = {
        "queued": "in the inbox, not yet fetched",
        "delivered": f"handed out {counted(found.deliveries, 'time')}, not acknowledged",
        "dead_lettered": f"moved to the dead letters after {counted(found.deliveries, 'attempt')}",
    }
    rows = [
        ("state", f"{found.state} ({deliveries.get(found.state, '')})"),
        ("from", found.sender or "-"),
        ("to", found.recipient or "-"),
        ("tier", found.tier or "-"),
        ("sent at", found.sent_at or "-"),
        ("deliveries", str(found.deliveries)),
        ("stream", f"{found.stream_key} entry {found.stream_entry}"),
    ]
    if found.consumer is not None:
        rows.append(("last handed to", f"{found.consumer} ({found.idle_ms} ms ago)"))
    if found.where == "dead":
        rows += [("reason", found.reason or "-"), ("dead at", found.dead_at or "-")]
    rows.append(
        ("redis-cli", f"redis-cli -c XRANGE '{found.stream_key}' {found.stream_entry} {found.stream_entry}")
    )
    width = max(len(label) for label, _ in rows)
    # values come from Redis, where anyone with access may have written anything: escaped
    lines = [f"  {label.ljust(width)}  {escaped(value)}" for label, value in rows]
    return "\n".join([found.envelope_id, *lines, "", f"read from {store}"])
