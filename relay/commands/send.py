"""``relay send``: a person sends a message through the running relay, under their own agent id.

The message goes over ``/mcp/agent`` like an agent's (``SendAgentMessage``, with headers minted from
the key file), so it gets every check an agent's send gets: the contract, the recipient, the inbox
cap, the rate limit, ``--ttl`` and ``--idempotency-key`` (the tool's ``ttl_ms`` and
``idempotency_key``, with their limits). First the two registrations are read from Redis, as the
dashboard's compose does: an unregistered recipient is refused before anything is written, an id an
agent registered (any provider but ``human``) is refused, never spoken for, a ``--from`` id not
registered yet whom the recipient's contact policy does not accept is refused (``not_accepted``,
docs/policy.md) without being registered, and any other is registered as a person (provider
``human``, host tier, endpoint: the login name, session ``HUMAN_SESSION``), so agents can answer it.
People are registered only here and by the dashboard: the agent endpoint refuses provider ``human``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import re
import sys
from typing import TYPE_CHECKING, Any

from adapters.redis.policy import RedisPolicyStore
from adapters.redis.registry import RedisRegistry
from broker.addresses import HUMAN_SESSION, HumanAddress
from broker.errors import InvalidArgument, NotAccepted, RelayError
from broker.ids import check_agent_id, check_idempotency_key, is_envelope_id
from broker.limits import MAX_TTL_MS, MIN_TTL_MS
from broker.text import escaped
from relay.claude_code.relay_http import Refused
from relay.commands import EXIT_RUNTIME, UsageError, bounded_int
from relay.settings import ShellSettings, add_options, load
from relay.shell import call_tool, contract, operator_view

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
    parser.add_argument(
        "--ttl",
        type=bounded_int(MIN_TTL_MS // 1000, MAX_TTL_MS // 1000, "seconds"),
        metavar="SECONDS",
        help=f"expire the message unread after SECONDS ({MIN_TTL_MS // 1000}..{MAX_TTL_MS // 1000}, at most "
        "the relay's --max-ttl): it is never handed out after that and moves to the recipient's dead "
        "letters (reason expired)",
    )
    parser.add_argument(
        "--idempotency-key",
        type=_idempotency_key,
        metavar="KEY",
        help="1-128 of A-Z a-z 0-9 . _ : -; sending again with the same KEY within the relay's "
        "--idempotency-window prints the first send's id and stores nothing (the same KEY with another "
        "recipient, message or --ttl is refused)",
    )
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
    arguments: dict[str, Any] = {"to": to, "message": message}
    if args.ttl is not None:
        arguments["ttl_ms"] = args.ttl * 1000
    if args.idempotency_key is not None:
        arguments["idempotency_key"] = args.idempotency_key
    try:  # before anything is written: a message the relay would refuse registers nobody
        contract().validate(contract().from_json(message))
    except RelayError as exc:
        return _refused(Refused(200, exc.code, exc.message), sender)
    person = asyncio.run(_person(settings, sender, to))
    if isinstance(person, Refused):
        return _refused(person, sender)
    session, registered = person
    try:
        sent = call_tool(settings, sender, session, "SendAgentMessage", arguments)
    except Refused as exc:
        return _refused(exc, sender)
    if args.json:
        print(json.dumps({**sent, "from": sender, "registered": registered}))
    else:
        print(sent["id"])
    return 0


async def _person(settings: ShellSettings, sender: str, to: str) -> tuple[str, bool] | Refused:
    """The session ``sender`` sends from, and whether this call registered it as a person; or why it
    may not send to ``to`` (nothing written then)."""
    async with operator_view(settings, "send") as view:
        registry = RedisRegistry(view.connection)
        if await registry.get(to) is None:
            return Refused(
                200,
                "unknown_recipient",
                f"recipient {to!r} is not registered; `relay agents` lists who is (nothing was sent, and "
                f"{sender} was not registered)",
            )
        current = await registry.get(sender)
        if current is None:
            # a first send the recipient's policy refuses registers nobody (the worker's check, made
            # atomically with the append, is the one that counts for every later send)
            policy = await RedisPolicyStore(view.connection).get(to)
            if not policy.accepts(sender, HumanAddress.provider):
                refused = NotAccepted(to, sender, policy.accept_from, "host")
                return Refused(200, refused.code, f"{refused.message} ({sender} was not registered)")
            endpoint = _label()
            await registry.register(sender, HumanAddress.parse(endpoint), HUMAN_SESSION)
            print(f"registered {sender} as a person (provider human, endpoint {endpoint})", file=sys.stderr)
            return HUMAN_SESSION, True
        if current.provider != HumanAddress.provider:
            return Refused(
                200,
                "invalid_argument",
                f"--from: {sender} is an agent's id (provider {escaped(current.provider)}), not a "
                "person's: send under your own id",
            )
        return current.session, False


def _idempotency_key(text: str) -> str:
    """``--idempotency-key``: the rule of the tool's ``idempotency_key`` (``check_idempotency_key``)."""
    try:
        return check_idempotency_key(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.violation.message) from None


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
