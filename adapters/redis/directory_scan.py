"""The directory of a store written before its index, and the one build of the index from it.

relay's earlier directory had no index: a listing ``SCAN``ned the ``<prefix>:agent:{*}`` hashes on
every master, in proportion to every key in Redis. The index (``Keys.directory``, read and kept by
``adapters/redis/directory.py``) is written on the register and retire paths, so a store written
before it holds registrations it does not name. Until the marker (``Keys.directory_built``) exists the
directory is that scan (this module's ``Scan``, ``scan_page``, ``scan_all``), as before.

``build`` makes the index from the scan: every registration found is added (``ZADD``: running it
twice, or on two workers at once, adds each id once), then the marker is set. The first listing
without the marker that scans everything builds (``Directory.agents``, ``Directory.candidates``: a
worker's first sweep or ``ListAgents``), and so does every ``relay migrate``, marker or not:
a worker of the earlier relay still running after the first build (a rolling upgrade) registers
without the index, and migrating again once the last of them stopped adds what they registered.

The build is sound because the index only has to be a superset of the registrations: an id added for
a registration retired meanwhile is filtered out on read, and every registration this relay makes
adds its id itself, before its script runs, whether or not a build ever ran.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection
from broker.errors import RelayError

SCAN_COUNT = 1000
"""Keys each SCAN call looks at (a hint to the server)."""
ADD_CHUNK = 1000
"""Ids one ``ZADD`` of ``add`` names at most."""

log = logging.getLogger("relay.redis.directory")


@dataclass(slots=True)
class Scan:
    """Where a walk over the registration hashes is: which master (by index into ``nodes``) and its
    cursor."""

    nodes: list[str] = field(default_factory=list)
    node: int = 0
    cursor: int = 0
    started: bool = False

    @property
    def done(self) -> bool:
        return self.started and self.node >= len(self.nodes)


async def scan_page(connection: RedisConnection, scan: Scan, count: int = SCAN_COUNT) -> list[str]:
    """One ``SCAN`` call further along ``scan``: the agent ids it found (possibly none)."""
    keys = connection.keys

    async def run(client: Redis | RedisCluster) -> list[str]:
        if not scan.started:
            scan.nodes = _masters(client)
            scan.started = True
        if scan.done:
            return []
        args: list[Any] = ["SCAN", scan.cursor, "MATCH", keys.registrations(), "COUNT", count]
        args += ["TYPE", "hash"]
        if isinstance(client, RedisCluster):
            node = client.get_node(node_name=scan.nodes[scan.node])
            if node is None:  # gone since the walk started (a failover): skip it
                scan.node, scan.cursor = scan.node + 1, 0
                return []
            cursor, found = await node.execute_command(*args)
        else:
            cursor, found = await client.execute_command(*args)  # type: ignore[no-untyped-call]
        scan.cursor = int(cursor)
        if scan.cursor == 0:
            scan.node += 1
        return [a for a in (keys.agent_of(str(k)) for k in found) if a is not None]

    return await connection.call(run, idempotent=True)


async def scan_all(connection: RedisConnection, max_calls: int = 100_000) -> list[str]:
    """Every agent id with a registration hash, sorted (a full walk of the keyspace)."""
    scan = Scan()
    found: set[str] = set()
    for _ in range(max_calls):
        found.update(await scan_page(connection, scan))
        if scan.done:
            break
    return sorted(found)


async def add(connection: RedisConnection, agents: Sequence[str], *, dry_run: bool = False) -> int:
    """Put ``agents`` in the index (score 0); how many were not in it yet (with ``dry_run``: would
    not be, nothing written). The one write that adds to the index: a registration's and the build's."""
    key = connection.keys.directory()
    added = 0
    for start in range(0, len(agents), ADD_CHUNK):
        chunk = agents[start : start + ADD_CHUNK]

        async def run(client: Redis | RedisCluster, chunk: Sequence[str] = chunk) -> int:
            if not dry_run:
                return int(str(await client.zadd(key, dict.fromkeys(chunk, 0))))
            pipe = client.pipeline(transaction=False)
            for agent in chunk:
                pipe.zscore(key, agent)
            return sum(score is None for score in await pipe.execute())

        added += await connection.call(run, idempotent=True)
    return added


async def built(connection: RedisConnection) -> bool:
    """Whether the index was built (the marker exists): it then names every registration."""
    marker = connection.keys.directory_built()

    async def run(client: Redis | RedisCluster) -> bool:
        return bool(await client.exists(marker))

    return await connection.call(run, idempotent=True)


@dataclass(frozen=True, slots=True)
class Build:
    agents: list[str]
    """The registered agent ids the scan found, sorted."""
    added: int
    """How many of them were not in the index yet (with ``dry_run``: would not have been)."""


async def build(connection: RedisConnection, *, dry_run: bool = False, best_effort: bool = False) -> Build:
    """Add every registration the scan finds to the index, then set the marker (``dry_run``: only
    count what would be added). Idempotent, and safe beside other builds, registrations and
    retirements (see the module). With ``best_effort`` (a listing building on the way) a refused write
    (a read-only Redis user, a store at maxmemory) is logged and the scan still answers."""
    agents = await scan_all(connection)
    marker = connection.keys.directory_built()

    async def mark(client: Redis | RedisCluster) -> None:
        await client.set(marker, int(time.time() * 1000), nx=True)

    try:
        added = await add(connection, agents, dry_run=dry_run)
        if not dry_run:
            await connection.call(mark, idempotent=True)
    except RelayError as exc:
        if not best_effort:
            raise
        log.warning("the agent directory index was not built (%s); listings scan until it is", exc)
        return Build(agents, 0)
    return Build(agents, added)


def _masters(client: Redis | RedisCluster) -> list[str]:
    if isinstance(client, RedisCluster):
        return [node.name for node in client.get_primaries()]
    return ["the server"]
