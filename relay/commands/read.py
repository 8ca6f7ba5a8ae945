"""``relay read --agent ID [--ack] [--wait SECONDS] [--json]``: an agent's unacknowledged envelopes.

Without ``--ack`` the envelopes are read from Redis without a fetch (``IOperatorView.unacknowledged``):
nothing is handed out, no delivery is counted, the agent still gets them. With ``--ack`` they are
fetched and acknowledged through the running relay, as the agent (its current session, read from its
registration), so they are gone from its inbox afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from adapters.redis.registry import RedisRegistry
from broker.envelope import Tier, format_ms, parse_ms
from broker.ids import check_agent_id
from broker.limits import MAX_FETCH_LIMIT
from broker.ports import StoredEnvelope
from broker.text import counted, escaped
from relay.claude_code.relay_http import Refused
from relay.commands import EXIT_RUNTIME, bounded_int
from relay.settings import ShellSettings, add_options, load
from relay.shell import call_tool, envelope_json, envelope_text, operator_view

if TYPE_CHECKING:
    from relay.commands import Subparsers

MAX_READ_WAIT_SECONDS = 3600
"""The longest ``relay read --wait`` may ask for: the shell polls the read-only view itself, so this is
not the relay's ``MAX_WAIT_SECONDS`` (one FetchAgentInbox long-poll)."""
POLL_SECONDS = 0.25
"""How often ``--wait`` looks again (one read-only script call each time)."""


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "read",
        help="show an agent's unacknowledged envelopes (read-only unless --ack)",
        description="Show agent --agent's unacknowledged envelopes, oldest first, with their text "
        "(escaped). Read-only: nothing is handed out or acknowledged, the agent still gets them. With "
        "--ack they are fetched and acknowledged through the running relay as the agent, and are gone.",
    )
    parser.add_argument("--agent", required=True, metavar="ID", help="whose inbox, e.g. builder")
    parser.add_argument("--ack", action="store_true", help="acknowledge what is shown (through the relay)")
    parser.add_argument(
        "--wait",
        type=bounded_int(0, MAX_READ_WAIT_SECONDS, "seconds"),
        default=0,
        metavar="SECONDS",
        help=f"when the inbox is empty, wait up to SECONDS (0..{MAX_READ_WAIT_SECONDS}) for an envelope",
    )
    parser.add_argument(
        "--limit",
        type=bounded_int(1, MAX_FETCH_LIMIT),
        default=100,
        metavar="N",
        help=f"show at most N envelopes, 1..{MAX_FETCH_LIMIT} (default 100)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_options(parser, ShellSettings)
    parser.set_defaults(handler=_read)


def _read(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    agent = check_agent_id(args.agent, "--agent")
    acknowledged: list[str] | None = None
    if args.ack:
        session = asyncio.run(_session(settings, agent))
        if session is None:
            print(
                f"relay: error: agent {agent} is not registered; `relay agents` lists them", file=sys.stderr
            )
            return EXIT_RUNTIME
        try:
            envelopes, now, acknowledged = _fetch_and_ack(settings, agent, session, args.limit, args.wait)
        except Refused as exc:
            reason = " ".join(escaped(exc.message or exc.code).split())
            print(f"relay: error: relay refused ({exc.code}): {reason}", file=sys.stderr)
            return EXIT_RUNTIME
    else:
        envelopes, now = asyncio.run(_peek(settings, agent, args.limit, args.wait))
    if args.json:
        data: dict[str, Any] = {
            "agent": agent,
            "time": format_ms(now),
            "envelopes": [envelope_json(e) for e in envelopes],
        }
        if acknowledged is not None:
            data["acknowledged"] = acknowledged
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0
    if not envelopes:
        print(f"no unacknowledged envelopes for {agent}")
        return 0
    print(f"{counted(len(envelopes), 'envelope')} for {agent}, oldest first:")
    for envelope in envelopes:
        print()
        print(envelope_text(envelope, now))
    if acknowledged is not None:
        print(f"\nacknowledged {counted(len(acknowledged), 'envelope')}")
    return 0


async def _peek(
    settings: ShellSettings, agent: str, limit: int, wait: int
) -> tuple[list[StoredEnvelope], int]:
    async with operator_view(settings, "read", agent=agent) as view:
        deadline = time.monotonic() + wait
        while True:
            found = await view.unacknowledged(agent, limit)
            if found or time.monotonic() >= deadline:
                return found, await view.now_ms()
            await asyncio.sleep(POLL_SECONDS)


async def _session(settings: ShellSettings, agent: str) -> str | None:
    async with operator_view(settings, "read --ack", agent=agent) as view:
        registration = await RedisRegistry(view.connection).get(agent)
    return None if registration is None else registration.session


def _fetch_and_ack(
    settings: ShellSettings, agent: str, session: str, limit: int, wait: int
) -> tuple[list[StoredEnvelope], int, list[str]]:
    arguments: dict[str, Any] = {"limit": limit}
    if wait:
        arguments["wait_ms"] = wait * 1000
    got = call_tool(settings, agent, session, "FetchAgentInbox", arguments, timeout=wait + 15)
    now = int(time.time() * 1000)
    envelopes = [_stored(agent, item) for item in got.get("envelopes", [])]
    ids = [e.envelope_id for e in envelopes]
    done = call_tool(settings, agent, session, "AcknowledgeAgentInbox", {"ids": ids}) if ids else {}
    return envelopes, now, list(done.get("acknowledged", []))


def _stored(agent: str, item: dict[str, Any]) -> StoredEnvelope:
    """One envelope of a ``FetchAgentInbox`` result, in the form the operator view returns."""
    from broker.agent_message import AgentMessageContract  # loads protovalidate: only for --ack

    contract = AgentMessageContract()
    message = contract.from_json(item["message"])
    return StoredEnvelope(
        envelope_id=str(item["id"]),
        sender=str(item["from"]),
        to=agent,
        tier=Tier.from_label(str(item["tier"])),
        sent_at_ms=parse_ms(str(item["sent_at"])),
        fields=contract.to_fields(message),
        deliveries=int(item["deliveries"]),
        first_delivery=int(item["deliveries"]) == 1,
    )
