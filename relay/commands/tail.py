"""``relay tail [AGENT] [--json]``: follow new envelopes live, read-only, until Ctrl-C.

Every envelope accepted after the command starts (to AGENT only, when given) is printed as it
arrives (``IOperatorView.follow``: a subscription to relay's wake-up channel and plain reads of the
inbox): nothing is fetched, consumed or acknowledged, and no delivery is counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from broker.ids import check_agent_id
from relay.settings import ShellSettings, add_options, load
from relay.shell import envelope_json, envelope_text, operator_view, out

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "tail",
        help="follow new envelopes live (read-only), until Ctrl-C",
        description="Print every envelope accepted from now on (to AGENT only, when given) as it "
        "arrives, until Ctrl-C. Read-only: nothing is fetched or acknowledged, no delivery is counted.",
    )
    parser.add_argument("agent", nargs="?", metavar="AGENT", help="only envelopes to this agent")
    parser.add_argument("--json", action="store_true", help="one JSON object per line and envelope")
    add_options(parser, ShellSettings)
    parser.set_defaults(handler=_tail)


def _tail(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    agent = check_agent_id(args.agent, "AGENT") if args.agent is not None else None
    try:
        asyncio.run(_follow(settings, agent, as_json=args.json))
    except KeyboardInterrupt:
        return 0
    return 0


async def _follow(settings: ShellSettings, agent: str | None, *, as_json: bool) -> None:
    async with operator_view(settings, "tail", agent=agent) as view:
        whose = f"to {agent}" if agent is not None else "to every agent"
        print(f"following new envelopes {whose} (read-only); Ctrl-C stops", file=sys.stderr, flush=True)
        async for envelope in view.follow(agent):
            if as_json:
                out(json.dumps(envelope_json(envelope), ensure_ascii=False))
            else:
                out(envelope_text(envelope, await view.now_ms()) + "\n")
