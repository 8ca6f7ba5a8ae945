"""``relay policy set|show``: whom an agent accepts messages from (its contact policy, docs/policy.md).

The commands work on relay's store (``--redis-url``, or the embedded server of the data dir), which
only the operator reaches: an agent cannot change whom it is reachable by through the agent endpoint.
``set`` takes effect on the next send, on every worker (the check runs with the append, in Redis), and
is one audit log line on stderr (``relay.policy``, JSON: agent, old, new).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from adapters.redis import RedisPolicyStore, RedisRegistry
from broker.ids import check_agent_id
from broker.limits import MAX_POLICY_AGENTS
from broker.policy import ContactPolicy, parse_accept_from
from relay import logs
from relay.settings import StoreSettings, add_options, load, store_url
from relay.shell import store_connection

if TYPE_CHECKING:
    from relay.commands import Subparsers

audit = logging.getLogger("relay.policy")
T = TypeVar("T")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "policy",
        help="set or show whom an agent accepts messages from (operators)",
        description="An agent's contact policy: open (the default: every registered sender), registered "
        "(senders with a registration: agents and people), or a list of agent ids (only those; people "
        "too only when listed). A send the policy refuses answers not_accepted and stores nothing. See "
        "docs/policy.md.",
    )
    commands = parser.add_subparsers(
        dest="policy", metavar="COMMAND", required=True, parser_class=type(parser)
    )
    setting = commands.add_parser(
        "set",
        help="set an agent's contact policy",
        description="Replace agent ID's contact policy; it applies to the next send, on every worker.",
    )
    setting.add_argument("agent", metavar="ID", help="the recipient's agent id, e.g. builder")
    setting.add_argument(
        "--accept-from",
        required=True,
        metavar="open|registered|LIST",
        help=f"open, registered, or a comma-separated LIST of agent ids (at most {MAX_POLICY_AGENTS}), "
        "e.g. planner,ada; a one-id list naming an agent called open or registered is written twice "
        "(open,open)",
    )
    setting.add_argument("--json", action="store_true", help="print the old and new policy as JSON")
    add_options(setting, StoreSettings)
    setting.set_defaults(handler=_set)
    showing = commands.add_parser("show", help="show an agent's contact policy")
    showing.add_argument("agent", metavar="ID", help="the agent id")
    showing.add_argument("--json", action="store_true", help="print JSON (one object)")
    add_options(showing, StoreSettings)
    showing.set_defaults(handler=_show)


def _store_call(args: argparse.Namespace, work: Callable[[RedisPolicyStore, bool], Awaitable[T]]) -> T:
    """``work(store, registered)`` on the Redis of the running relay; ``registered``: whether the agent
    has a registration (a policy may be set before the agent registers)."""
    url = store_url(load(StoreSettings, args), "policy")

    async def run() -> T:
        async with store_connection(url) as connection:
            registered = await RedisRegistry(connection).get(args.agent) is not None
            return await work(RedisPolicyStore(connection), registered)

    return asyncio.run(run())


def _set(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "ID")
    new = parse_accept_from(args.accept_from)  # refused before Redis is opened: nothing changes

    async def work(store: RedisPolicyStore, registered: bool) -> tuple[ContactPolicy, bool]:
        return await store.set(agent, new), registered

    old, registered = _store_call(args, work)
    logs.configure("json", "info")
    audit.info(
        "contact policy changed",
        extra={"event": "policy_changed", "agent": agent, "old": old.as_json(), "new": new.as_json()},
    )
    if args.json:
        print(
            json.dumps({"agent": agent, "old": old.as_json(), "new": new.as_json(), "registered": registered})
        )
        return 0
    print(f"{agent} accepts messages from: {new.describe()} (was: {old.describe()})")
    if not registered:
        print(f"note: {agent} is not registered yet; the policy applies once it is")
    return 0


def _show(args: argparse.Namespace) -> int:
    agent = check_agent_id(args.agent, "ID")

    async def work(store: RedisPolicyStore, registered: bool) -> tuple[ContactPolicy, bool]:
        return await store.get(agent), registered

    policy, registered = _store_call(args, work)
    if args.json:
        print(json.dumps({"agent": agent, **policy.as_json(), "registered": registered}))
        return 0
    print(f"{agent} accepts messages from: {policy.describe()}")
    if not registered:
        print(f"note: {agent} is not registered")
    return 0
