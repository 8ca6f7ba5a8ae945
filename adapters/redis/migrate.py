"""``relay migrate``: bring a store written by relay's earlier layouts to the current one (idempotent).

The earliest layout kept every agent id in one global set, ``<prefix>:agents``, which its register
script wrote together with the agent's own keys. The next had no index at all: the directory was a
scan of the registration hashes. The current one lists the agents from an index that no script writes
(``Keys.directory``, ``adapters/redis/directory.py``), so every script still touches one agent's
keys. Registration hashes, inbox and dead-letter streams, rate buckets and entry fields are the same
in all of them, so migrating is:

1. for every agent in the old set that has a registration, make sure its inbox stream and consumer
   group exist (``XGROUP CREATE ... MKSTREAM``; an existing group is kept as it is);
2. delete the old set;
3. add every registration the scan finds to the directory's index and set its marker
   (``adapters/redis/directory_scan.py``, ``build``): done even when the marker exists, for what a
   worker of an earlier relay registered after the first build;
4. note every stored reply in the thread index (``adapters/redis/threads.py``, ``index_replies``),
   so threads of envelopes sent before the index are found by it.

Running it again finds no old set, indexes no id and changes nothing. ``dry_run`` only reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.directory_scan import build
from adapters.redis.keys import GROUP
from adapters.redis.threads import index_replies
from broker.text import counted

_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Migration:
    legacy_index: bool
    """The old global set was there (before this run)."""
    indexed: int
    """Agent ids it listed."""
    groups_created: int
    """Inbox streams or groups that were missing and were created."""
    registered: int
    """Registrations the scan found (the directory's build)."""
    dry_run: bool
    replies_indexed: int = 0
    """Stored replies noted in the thread index (sent before it existed)."""
    directory_indexed: int = 0
    """Registered agent ids added to the directory's index (registered before it existed)."""

    def summary(self) -> str:
        noted = "would note" if self.dry_run else "noted"
        replies = (
            f"{noted} {counted(self.replies_indexed, 'stored reply', 'stored replies')} in the thread index"
        )
        put = "would index" if self.dry_run else "indexed"
        directory = f"{put} {counted(self.directory_indexed, 'agent id')} in the directory"
        if not self.legacy_index:
            agents = counted(self.registered, "agent")
            done = [directory] if self.directory_indexed else []
            done += [replies] if self.replies_indexed else []
            if done:
                return f"{'; '.join(done)} ({agents})"
            return f"nothing to migrate: the store already has the current layout ({agents})"
        verb = "would delete" if self.dry_run else "deleted"
        made = "would create" if self.dry_run else "created"
        return (
            f"{verb} the old agent index ({counted(self.indexed, 'id')}); {made} "
            f"{counted(self.groups_created, 'missing inbox group')}; "
            f"{counted(self.registered, 'registered agent')} found by scan; {directory}; {replies}"
        )


async def migrate(connection: RedisConnection, *, dry_run: bool = False) -> Migration:
    keys = connection.keys
    index = keys.legacy_agents()

    async def members(client: Redis | RedisCluster) -> list[str]:
        if not await client.exists(index):
            return []
        found: list[str] = []
        cursor = 0
        for _ in range(1_000_000):
            cursor, page = await client.sscan(index, cursor, count=_PAGE)
            found += [str(m) for m in page]
            if int(cursor) == 0:
                break
        return sorted(set(found))

    async def exists(client: Redis | RedisCluster) -> bool:
        return bool(await client.exists(index))

    legacy = await connection.call(exists, idempotent=True)
    agents = await connection.call(members, idempotent=True) if legacy else []
    created = 0
    for agent in agents:

        async def ensure(client: Redis | RedisCluster, agent: str = agent) -> int:
            if not await client.exists(keys.registration(agent)):
                return 0
            if dry_run:
                groups = await _groups(client, keys.inbox(agent))
                return 0 if GROUP in groups else 1
            try:
                await client.xgroup_create(keys.inbox(agent), GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
                return 0
            return 1

        created += await connection.call(ensure, idempotent=True)
    if legacy and not dry_run:

        async def drop(client: Redis | RedisCluster) -> None:
            await client.delete(index)

        await connection.call(drop, idempotent=True)
    directory = await build(connection, dry_run=dry_run)
    replies = await index_replies(connection, directory.agents, dry_run=dry_run)
    return Migration(legacy, len(agents), created, len(directory.agents), dry_run, replies, directory.added)


async def _groups(client: Redis | RedisCluster, key: str) -> set[str]:
    try:
        return {str(g["name"]) for g in await client.xinfo_groups(key)}
    except ResponseError:
        return set()
