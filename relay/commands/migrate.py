"""``relay migrate``: bring the Redis store of an earlier relay to the current key layout.

Idempotent: a second run reports that there is nothing to migrate. What changes is written in
``adapters.redis.migrate`` and docs/redis-layout.md.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.migrate import migrate
from relay.settings import StoreSettings, add_options, load, store_url

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="bring a store written by an earlier relay to the current Redis layout (idempotent)",
        description="Move the Redis store of an earlier relay to the current key layout: drop the old "
        "global agent set (every script now touches one agent's keys, so the same layout runs on one "
        "Redis or a Redis Cluster) after making sure every agent in it has its inbox group, and add "
        "every registered agent to the directory's index (so listings never scan the keyspace). Safe "
        "to run twice, and while relay serve runs; after a rolling upgrade, run it again once the last "
        "earlier worker stopped.",
    )
    parser.add_argument("--prefix", default="relay", help="the relay's Redis key prefix (default relay)")
    parser.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    add_options(parser, StoreSettings)
    parser.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    url = store_url(load(StoreSettings, args), "migrate")

    async def run() -> str:
        connection = RedisConnection(RedisSettings(url=url, prefix=args.prefix))
        await connection.open()
        try:
            return (await migrate(connection, dry_run=args.dry_run)).summary()
        finally:
            await connection.close()

    print(asyncio.run(run()))
    return 0
