"""``relay thread ENVELOPE_ID [--json]``: the conversation an envelope belongs to, in order.

The thread is found by ``in_reply_to`` links among the envelopes stored in every inbox and every
history (``broker.threads``): an acknowledged, dead-lettered or expired envelope stays in its thread for
the history retention (docs/history.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from broker.envelope import format_ms
from broker.ids import is_envelope_id
from broker.ports import StoredEnvelope
from broker.text import counted, escaped
from broker.threads import IN_REPLY_TO
from relay.commands import EXIT_RUNTIME, UsageError, bounded_int
from relay.settings import ShellSettings, add_options, load
from relay.shell import envelope_json, envelope_text, operator_view

if TYPE_CHECKING:
    from relay.commands import Subparsers

MAX_INDENT = 8


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "thread",
        help="show the conversation an envelope belongs to (by in_reply_to)",
        description="Show the envelopes linked to ENVELOPE_ID by in_reply_to (what it answers, and every "
        "answer to those, transitively), oldest first, each answer indented under what it answers, from "
        "every inbox and every history (acknowledged envelopes stay for --history-retention). Read-only.",
    )
    parser.add_argument("envelope_id", metavar="ENVELOPE_ID", help="an envelope id (env_...)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--limit", type=bounded_int(1, 100_000), default=1000, metavar="N", help="at most N (default 1000)"
    )
    add_options(parser, ShellSettings)
    parser.set_defaults(handler=_thread)


def _thread(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    if not is_envelope_id(args.envelope_id):
        raise UsageError(f"{escaped(args.envelope_id)[:80]!r} is not an envelope id (env_ and 26 characters)")

    async def run() -> tuple[list[StoredEnvelope], int]:
        async with operator_view(settings, "thread") as view:
            return await view.thread(args.envelope_id, args.limit), await view.now_ms()

    envelopes, now = asyncio.run(run())
    if args.json:
        data = {
            "envelope": args.envelope_id,
            "time": format_ms(now),
            "envelopes": [envelope_json(e) for e in envelopes],
        }
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return 0 if envelopes else EXIT_RUNTIME
    if not envelopes:
        print(
            f"no stored envelope is {args.envelope_id} or answers it, in any inbox or history (a history "
            "keeps what left an inbox for --history-retention); `relay read --agent ID` shows what an "
            "inbox holds"
        )
        return EXIT_RUNTIME
    depth: dict[str, int] = {}
    blocks = []
    for envelope in envelopes:
        parent = envelope.fields.get(IN_REPLY_TO, "")
        depth[envelope.envelope_id] = min(depth[parent] + 1, MAX_INDENT) if parent in depth else 0
        lines = envelope_text(envelope, now, indent="    " * depth[envelope.envelope_id]).split("\n")
        mark = "* " if envelope.envelope_id == args.envelope_id else "  "  # the one asked about
        blocks.append("\n".join([mark + lines[0], *("  " + line for line in lines[1:])]))
    print(f"thread of {args.envelope_id}: {counted(len(envelopes), 'stored envelope')}, oldest first\n")
    print("\n\n".join(blocks))
    return 0
