"""The agent directory: which agents are registered, read from an index of their ids.

The index is one sorted set, ``Keys.directory``, every score 0, so ``ZRANGEBYLEX`` reads it in id
order: a full listing reads the ids there are (in proportion to the agents, not to the keyspace), a
page (``(after`` .. ``+``) only the ids it returns. It lives on a slot of its own, and every script
touches the slot of one agent, so no script writes it. It is kept a **superset** of the registrations
by the order of the writes instead, and every read filters it:

- a registration adds its id (``enter``) before ``register.lua`` runs: no registration ever exists
  whose id the index lacks. When the script then refuses (a retired session) or fails, the id stays
  without a registration, and reads drop it;
- a retirement takes the id out (``leave``) only after ``retire.lua`` succeeded (``--purge`` too), and
  then looks at the registration once more: a session that registered the agent again meanwhile keeps
  it listed. A register that created the registration adds the id once more after its script, for
  the retirement whose removal fell between its first add and its script. So whichever of the two
  writes last, an agent with a registration stays in the index;
- every read keeps only the ids whose registration hash exists (one pipelined ``EXISTS`` per page, or
  the ``HGETALL`` that ``RedisRegistry.list`` does anyway): a listed id is registered. The ids without
  one are those of registers refused or failed after their add (a retired agent's: retiring it again
  removes the id), a few bytes each.

A store written before the index is listed by the old keyspace scan until the index has been built
from it (``adapters/redis/directory_scan.py``: the first listing that scans builds it). Measured in
docs/performance.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection
from adapters.redis.directory_scan import Scan, add, build, built, scan_page

PAGE = 1000
"""Ids one ``ZRANGEBYLEX`` of the index reads at most."""
MAX_PAGES = 100_000
"""Pages of one full listing at most (100 million ids)."""


@dataclass(slots=True)
class Walk:
    """Where a walk over the directory is, for the gauges' bounded refreshes across calls: along the
    index (``after`` the last id read) or, while it is not built, along the scan."""

    indexed: bool | None = None
    """Whether the walk reads the index; decided by its first page."""
    after: str | None = None
    ended: bool = False
    scan: Scan = field(default_factory=Scan)

    @property
    def done(self) -> bool:
        if self.indexed is None:
            return False
        return self.ended if self.indexed else self.scan.done


class Directory:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    # -- writes: the only two places the register and retire paths touch the index ------------------

    async def enter(self, agent: str) -> None:
        """Put ``agent`` in the index: before ``register.lua`` runs, and once more after a script
        that created the registration (see the module). Redis trouble raises the store's
        ``BackendUnavailable`` (or ``BackendRefused``): the caller registers nothing then."""
        await add(self.connection, [agent])

    async def leave(self, agent: str) -> None:
        """Take ``agent`` out of the index, after ``retire.lua`` succeeded; put back when a session
        registered it again meanwhile (see the module)."""
        key, registration = self.connection.keys.directory(), self.connection.keys.registration(agent)

        async def run(client: Redis | RedisCluster) -> bool:
            await client.zrem(key, agent)
            return bool(await client.exists(registration))

        if await self.connection.call(run, idempotent=True):
            await self.enter(agent)

    # -- reads -------------------------------------------------------------------------------------

    async def agents(self) -> list[str]:
        """Every registered agent id, sorted (a full listing: for the registry, the CLI, the thread
        read); on a store whose index was never built, the scan, which builds it."""
        first, indexed = await asyncio.gather(self._range(None, PAGE), built(self.connection))
        if not indexed:
            return (await build(self.connection, best_effort=True)).agents
        found: list[str] = []
        ids = first
        for _ in range(MAX_PAGES):
            found += await self.registered(ids)
            if len(ids) < PAGE:
                break
            ids = await self._range(ids[-1], PAGE)
        return found

    async def candidates(self, after: str | None, count: int) -> tuple[list[str], bool]:
        """Up to ``count`` ids after ``after`` in id order, some maybe no longer registered (the
        caller reads each registration and drops those), and whether more may follow."""
        ids, indexed = await asyncio.gather(self._range(after, count), built(self.connection))
        if not indexed:
            everyone = (await build(self.connection, best_effort=True)).agents
            later = [a for a in everyone if after is None or a > after]
            return later[:count], len(later) > count
        return ids, len(ids) == count

    async def page(self, walk: Walk, count: int = PAGE) -> list[str]:
        """The registered ids of one read further along ``walk`` (possibly none): ``count`` index
        entries, or one ``SCAN`` call while the index is not built (the walk never builds it)."""
        if walk.indexed is None:
            walk.indexed = await built(self.connection)
        if not walk.indexed:
            return await scan_page(self.connection, walk.scan, count)
        if walk.ended:
            return []
        ids = await self._range(walk.after, count)
        walk.ended = len(ids) < count
        walk.after = ids[-1] if ids else walk.after
        return await self.registered(ids)

    async def registered(self, agents: Sequence[str]) -> list[str]:
        """Those of ``agents`` that have a registration hash, in order."""
        if not agents:
            return []
        keys = [self.connection.keys.registration(agent) for agent in agents]
        found = await self.connection.commands([(key, ("EXISTS", key)) for key in keys])
        return [a for a, n in zip(agents, found, strict=True) if n]

    async def _range(self, after: str | None, count: int) -> list[str]:
        key = self.connection.keys.directory()
        low = "-" if after is None else f"({after}"

        async def run(client: Redis | RedisCluster) -> list[str]:
            return [str(a) for a in await client.zrangebylex(key, low, "+", start=0, num=count)]

        return await self.connection.call(run, idempotent=True)
