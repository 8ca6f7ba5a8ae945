"""``relay send``: a person sends a message through the running relay, under their own agent id.

The message goes over ``/mcp/agent`` like an agent's (``SendAgentMessage``, with headers minted from
the key file), so it gets every check an agent's send gets: the contract, the recipient, the inbox
cap, the rate limit. A ``--from`` id that is not registered yet is first registered with a ``human``
address (host tier, endpoint: the login name), so agents can answer it; people send from the session
``HUMAN_SESSION``, and an id registered from another session (an agent's) is refused, not taken over.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
from typing import TYPE_CHECKING, Any

from broker.addresses import HUMAN_SESSION
from broker.ids import check_agent_id, is_envelope_id
from broker.text import escaped
from relay.claude_code.relay_http import Refused
from relay.commands import EXIT_RUNTIME, UsageError
from relay.settings import ShellSettings, add_options, load
from relay.shell import call_tool

if TYPE_CHECKING:
    from relay.commands import Subparsers

_LABEL = re.compile(r"[A-Za-z0-9._-]{1,128}")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "send",
        help="send a message to an agent through the running relay, as a person",
        description="Send TEXT (or, without TEXT, standard input) to agent --to, under your own id "
        "--from, through the running relay (--url) with the checks an agent's send gets. An id that is "
        "not registered yet is registered as a person (provider human, host tier), so agents can "
        "answer it. Prints the envelope id.",
    )
    parser.add_argument("--from", dest="sender", required=True, metavar="ID", help="your agent id, e.g. ada")
    parser.add_argument("--to", required=True, metavar="ID", help="the recipient's agent id")
    parser.add_argument(
        "--kind",
        metavar="note|request|reply|status",
        help="the message kind, one of agent.proto's (default: reply with --reply-to, else note)",
    )
    parser.add_argument("--reply-to", metavar="ENVELOPE_ID", help="the envelope this message answers")
    parser.add_argument("--reference", metavar="URL", help="a pointer to related material (URL, path, id)")
    parser.add_argument("--json", action="store_true", help="print the send result as JSON")
    parser.add_argument("text", nargs="?", metavar="TEXT", help="the message (default: read standard input)")
    add_options(parser, ShellSettings)
    parser.set_defaults(handler=_send)


def _send(args: argparse.Namespace) -> int:
    settings = load(ShellSettings, args)
    sender = check_agent_id(args.sender, "--from")
    to = check_agent_id(args.to, "--to")
    from broker.agent_message import KIND_LABELS  # loads protovalidate: only when sending

    if args.kind is not None and args.kind not in KIND_LABELS.values():
        kinds = ", ".join(KIND_LABELS.values())
        raise UsageError(f"--kind {escaped(args.kind)[:40]!r} is not a message kind; use one of {kinds}")
    if args.reply_to is not None and not is_envelope_id(args.reply_to):
        raise UsageError(f"--reply-to {escaped(args.reply_to)[:80]!r} is not an envelope id (env_...)")
    message: dict[str, Any] = {
        "kind": args.kind or ("reply" if args.reply_to else "note"),
        "text": args.text if args.text is not None else _stdin_text(),
    }
    if args.reply_to is not None:
        message["in_reply_to"] = args.reply_to
    if args.reference is not None:
        message["reference"] = args.reference
    arguments = {"to": to, "message": message}
    registered = False
    try:
        try:
            sent = call_tool(settings, sender, HUMAN_SESSION, "SendAgentMessage", arguments)
        except Refused as exc:
            if exc.code != "unregistered_agent":
                raise
            endpoint = _label()
            address = {"provider": "human", "endpoint": endpoint}
            call_tool(settings, sender, HUMAN_SESSION, "RegisterAgentAddress", address)
            registered = True
            print(f"registered {sender} as a person (provider human, endpoint {endpoint})", file=sys.stderr)
            sent = call_tool(settings, sender, HUMAN_SESSION, "SendAgentMessage", arguments)
    except Refused as exc:
        return _refused(exc, sender)
    if args.json:
        print(json.dumps({**sent, "from": sender, "registered": registered}))
    else:
        print(sent["id"])
    return 0


def _refused(exc: Refused, sender: str) -> int:
    if exc.code in ("session_superseded", "session_not_registered"):
        reason = (
            f"{sender} is registered from another session (an agent's, or a person's elsewhere); "
            "send under your own id"
        )
    else:
        reason = " ".join(escaped(exc.message or exc.code).split())
    print(f"relay: error: relay refused the send ({exc.code}): {reason}", file=sys.stderr)
    return EXIT_RUNTIME


def _stdin_text() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("give the message as TEXT, or pipe it on standard input")
    from broker.agent_message import MAX_TEXT_BYTES

    raw = sys.stdin.buffer.read(MAX_TEXT_BYTES + 2)
    if len(raw) > MAX_TEXT_BYTES + 1:
        raise UsageError(f"the message on standard input is longer than {MAX_TEXT_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("the message on standard input is not UTF-8") from None
    return text.removesuffix("\n")


def _label() -> str:
    """The endpoint of a person's address: their login name when it is a plain label."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return HUMAN_SESSION
    return name if _LABEL.fullmatch(name) else HUMAN_SESSION
