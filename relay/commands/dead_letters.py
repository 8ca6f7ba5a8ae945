"""``relay dead-letters list|requeue``: inspect and requeue an agent's dead letters on Redis.

Like ``relay serve``, the commands find Redis through ``--redis-url`` or ``RELAY_REDIS_URL``. See
docs/delivery.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.inspect import report
from adapters.redis.keys import DEFAULT_PREFIX
from broker.delivery import DeadLetter
from broker.envelope import format_ms
from broker.errors import InvalidArgument, RelayError
from broker.ids import check_agent_id, is_envelope_id
from broker.text import counted, escaped, shown
from relay.commands import EXIT_RUNTIME, bounded_int
from relay.settings import StoreSettings, add_options, load, store_named, store_url
from relay.shell import unknown_agent

if TYPE_CHECKING:
    from relay.commands import Subparsers

MAX_LIST = 10_000
_TEXT_CHARS = 80
T = TypeVar("T")


def register(subparsers: Subparsers) -> None:
    """Add ``dead-letters list AGENT`` and ``dead-letters requeue AGENT [IDS...]``."""
    group = subparsers.add_parser(
        "dead-letters",
        help="list or requeue an agent's dead letters",
        description="Envelopes that failed delivery too often (a receive loop's max attempts, or "
        "relay serve --max-deliveries hand-outs without an acknowledgement) or expired unacknowledged "
        "are kept in the agent's dead-letter list, with the reason. List them, or move them back into "
        "the agent's inbox.",
    )
    actions = group.add_subparsers(dest="dead_letters_action", metavar="ACTION", required=True)

    listing = actions.add_parser(
        "list",
        help="list an agent's dead letters, oldest first",
        description="List an agent's dead letters, oldest first: id, sender, attempts, reason, time, "
        "kind and the start of the text.",
    )
    listing.add_argument("agent", metavar="AGENT", help="the agent id, e.g. builder")
    listing.add_argument("--json", action="store_true", help="print JSON (one object) instead of text")
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIST),
        default=100,
        metavar="N",
        help=f"at most N, 1..{MAX_LIST} (default 100)",
    )
    _add_redis_options(listing)
    listing.set_defaults(handler=_list)

    requeue = actions.add_parser(
        "requeue",
        help="move dead letters back into the agent's inbox",
        description="Move dead letters back into the agent's inbox, oldest first. Each gets a new "
        "envelope id and is delivered again from attempt 1. Without IDS, all of them.",
    )
    requeue.add_argument("agent", metavar="AGENT", help="the agent id, e.g. builder")
    requeue.add_argument("ids", nargs="*", metavar="ID", help="envelope ids as listed (default: all)")
    requeue.add_argument("--json", action="store_true", help="print JSON (one object) instead of text")
    _add_redis_options(requeue)
    requeue.set_defaults(handler=_requeue)


def _add_redis_options(parser: argparse.ArgumentParser) -> None:
    add_options(parser, StoreSettings)
    parser.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"the relay's Redis key prefix (default {DEFAULT_PREFIX})"
    )


def _queue_call(args: argparse.Namespace, work: Callable[[RedisDeliveryQueue], Awaitable[T]]) -> T:
    settings = load(StoreSettings, args)
    url = store_url(settings, "dead-letters")
    known = asyncio.run(report(url, agent=args.agent, prefix=args.prefix))
    if not known.agents[0].exists:
        raise RelayError(unknown_agent(args.agent, known.indexed, store_named(settings, known.redis)))

    async def run() -> T:
        connection = RedisConnection(RedisSettings(url=url, prefix=args.prefix))
        queue = RedisDeliveryQueue(connection)
        await queue.open()
        try:
            return await work(queue)
        finally:
            await queue.close()

    return asyncio.run(run())


def _list(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "AGENT")

    async def work(queue: RedisDeliveryQueue) -> tuple[int, list[DeadLetter]]:
        return await queue.dead_letter_count(agent), await queue.dead_letters(agent, args.limit)

    total, letters = _queue_call(args, work)
    if args.json:
        print(json.dumps({"agent": agent, "total": total, "dead_letters": [_json(x) for x in letters]}))
        return 0
    if not letters:
        print(f"no dead letters for {agent}")
        return 0
    count = (
        f"{len(letters)} of {counted(total, 'dead letter')}"
        if total > len(letters)
        else counted(total, "dead letter")
    )
    print(f"{count} for {agent}, oldest first:")
    for letter in letters:
        # everything but the counts and times was written by agents or read from Redis: escaped
        kind = shown(letter.fields.get("kind", "-"), 16)
        print(
            f"{escaped(letter.envelope_id)}  from={escaped(letter.sender)}  attempts={letter.attempts}  "
            f"dead_at={format_ms(letter.dead_at_ms)}  kind={kind}"
        )
        print(f"    reason: {shown(letter.reason, 200)}")
        print(f"    text:   {shown(letter.fields.get('text', '-'), _TEXT_CHARS)}")
    return 0


def _requeue(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "AGENT")
    for i, envelope_id in enumerate(args.ids):
        if not is_envelope_id(envelope_id):
            message = f"{envelope_id!r:.80} is not an envelope id; copy it from `list`"
            raise InvalidArgument(f"ID[{i}]", "envelope_id.pattern", message)
    wanted: list[str] | None = list(dict.fromkeys(args.ids)) or None

    async def work(queue: RedisDeliveryQueue) -> tuple[list[str], list[str]]:
        missing: list[str] = []
        if wanted is not None:
            present = {x.envelope_id for x in await queue.dead_letters(agent, MAX_LIST)}
            missing = [i for i in wanted if i not in present]
        return await queue.requeue(agent, wanted), missing

    requeued, missing = _queue_call(args, work)
    if args.json:
        print(json.dumps({"agent": agent, "requeued": requeued, "not_found": missing}))
    else:
        print(f"requeued {counted(len(requeued), 'dead letter')} of {agent}")
        for new_id in requeued:
            print(f"  new id {new_id}")
        if missing:
            print(f"not found (already requeued, or not {agent}'s): {' '.join(missing)}")
    return EXIT_RUNTIME if missing else 0


def _json(letter: DeadLetter) -> dict[str, object]:
    data: dict[str, object] = {
        "id": letter.envelope_id,
        "from": letter.sender,
        "to": letter.to,
        "tier": letter.tier.label,
        "sent_at": format_ms(letter.sent_at_ms),
        "attempts": letter.attempts,
        "reason": letter.reason,
        "dead_at": format_ms(letter.dead_at_ms),
        "fields": dict(letter.fields),
    }
    if letter.requeued_from:
        data["requeued_from"] = letter.requeued_from[0]
    return data
