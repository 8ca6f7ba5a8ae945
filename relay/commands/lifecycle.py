"""``relay agents retire ID [--purge]`` and ``relay inbox purge ID [--yes]``: an operator ends an
agent's registration, or drops what is queued for it (``IRegistry.retire``, ``IInboxStore.purge``).

Both work on relay's store (``--redis-url``, or the embedded server of the data dir), which only the
operator reaches, take effect at once on every worker (the scripts run in Redis, on the agent's slot)
and write one audit line on stderr (``relay.lifecycle``, JSON). ``inbox purge`` without ``--yes``
says what it would drop and changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry
from adapters.redis.inspect import AgentInspection, Inspector, redacted
from adapters.redis.registry import is_retired
from broker.errors import RelayError, UnregisteredAgent
from broker.ids import check_agent_id
from broker.ports import Retired
from broker.text import counted
from relay import logs
from relay.settings import StoreSettings, add_options, load, store_named, store_url
from relay.shell import store_connection, unknown_agent

if TYPE_CHECKING:
    from relay.commands import Subparsers

audit = logging.getLogger("relay.lifecycle")
T = TypeVar("T")


def add_retire(commands: Subparsers) -> None:
    """``retire`` under ``relay agents``."""
    retire = commands.add_parser(
        "retire",
        help="end an agent's registration (its sessions are refused; sends to it get unknown_recipient)",
        description="End agent ID's registration: sends to it are refused (unknown_recipient) and the "
        "sessions it had get agent_retired on every call, registering again included; a new session "
        "may register the id afresh. Its inbox, dead letters and history stay readable (relay read, "
        "show, dead-letters, history) until purged or, for the history, until --history-retention "
        "ends. With --purge they are deleted now: each queued envelope reads 'purged' in its "
        "sender's GetMessageStatus.",
    )
    retire.add_argument("agent", metavar="ID", help="the agent id, e.g. builder")
    retire.add_argument(
        "--purge", action="store_true", help="also delete its inbox, dead letters and history now"
    )
    retire.add_argument("--json", action="store_true", help="print JSON (one object)")
    add_options(retire, StoreSettings)
    retire.set_defaults(handler=_retire)


def register(subparsers: Subparsers) -> None:
    """``relay inbox purge``."""
    inbox = subparsers.add_parser(
        "inbox",
        help="drop what is queued in an agent's inbox (operators)",
        description="Operate on an agent's inbox in relay's store.",
    )
    commands = inbox.add_subparsers(dest="inbox", metavar="COMMAND", required=True, parser_class=type(inbox))
    purge = commands.add_parser(
        "purge",
        help="drop every envelope queued for an agent (needs --yes)",
        description="Drop every envelope in agent ID's inbox, handed out or not: each reads 'purged' "
        "in its sender's GetMessageStatus; none goes to the history or the dead letters. Without "
        "--yes, say what would be dropped and change nothing.",
    )
    purge.add_argument("agent", metavar="ID", help="the agent id, e.g. builder")
    purge.add_argument("--yes", action="store_true", help="drop them (without it nothing changes)")
    purge.add_argument("--json", action="store_true", help="print JSON (one object)")
    add_options(purge, StoreSettings)
    purge.set_defaults(handler=_purge)


def _on_store(
    args: argparse.Namespace, command: str, work: Callable[[RedisConnection, str], Awaitable[T]]
) -> T:
    """``work(connection, store name)`` on the Redis of the running relay."""
    settings = load(StoreSettings, args)
    url = store_url(settings, command)

    async def run() -> T:
        async with store_connection(url) as connection:
            return await work(connection, store_named(settings, redacted(url)))

    return asyncio.run(run())


def _retire(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "ID")

    async def work(connection: RedisConnection, store: str) -> tuple[Retired, AgentInspection]:
        (before,) = await Inspector(connection).inspect([agent])
        try:
            done = await RedisRegistry(connection).retire(agent, purge=args.purge)
        except UnregisteredAgent:
            registered = len(await Inspector(connection).directory.agents())
            raise RelayError(unknown_agent(agent, registered, store)) from None
        return done, before

    done, before = _on_store(args, "agents retire", work)
    _audit(
        "agent retired", "agent_retired", agent, retired_now=done.now, purge=args.purge, purged=done.purged
    )
    if args.json:
        print(
            json.dumps(
                {
                    "agent": agent,
                    "retired_now": done.now,
                    "sessions": list(done.sessions),
                    "purged": done.purged if args.purge else None,
                }
            )
        )
        return 0
    head = f"retired {agent}" if done.now else f"{agent} was already retired"
    sessions = ", ".join(done.sessions)
    print(f"{head}: sends to it get unknown_recipient; its sessions ({sessions}) get agent_retired")
    if args.purge:
        print(
            f"purged: {counted(done.purged, 'queued envelope')} dropped (each 'purged' in its sender's "
            "status); dead letters and history deleted"
        )
    else:
        print(
            f"kept for operators: its inbox ({counted(before.inbox_depth, 'envelope')}), "
            f"{counted(before.dead_letters, 'dead letter')} and history; `relay inbox purge {agent} "
            "--yes` drops the inbox"
        )
    return 0


def _purge(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "ID")

    async def work(connection: RedisConnection, store: str) -> tuple[AgentInspection, int | None]:
        inspector = Inspector(connection)
        (found,) = await inspector.inspect([agent])
        if not found.exists and not await is_retired(connection, agent):
            raise RelayError(unknown_agent(agent, len(await inspector.directory.agents()), store))
        if not args.yes:
            return found, None
        return found, await RedisInboxStore(connection).purge(agent)

    found, dropped = _on_store(args, "inbox purge", work)
    if dropped is None:
        if args.json:
            print(json.dumps({"agent": agent, "would_drop": found.inbox_depth, "pending": found.pending}))
            return 0
        print(
            f"would drop {counted(found.inbox_depth, 'envelope')} queued for {agent} "
            f"({found.pending} handed out, not acknowledged); nothing changed: run it again with --yes"
        )
        return 0
    _audit("inbox purged", "inbox_purged", agent, purged=dropped)
    if args.json:
        print(json.dumps({"agent": agent, "purged": dropped}))
        return 0
    print(
        f"dropped {counted(dropped, 'envelope')} from {agent}'s inbox;"
        " each reads 'purged' in its sender's status"
    )
    return 0


def _audit(message: str, event: str, agent: str, **fields: object) -> None:
    logs.configure("json", "info")
    audit.info(message, extra={"event": event, "agent": agent, **fields})
