"""The agent directory: which agents are registered, found by ``SCAN``ning registration hashes.

There is no global index (one set of every agent would live in one cluster slot, and every register
script would touch two slots): a listing scans ``<prefix>:agent:{*}`` hashes on every master (on one
Redis, on the one server). ``Scan`` walks in bounded pages with a cursor that survives between calls,
for the gauges' bounded refreshes. Measured with 1,000 agents in docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection

SCAN_COUNT = 1000
"""Keys each SCAN call looks at (a hint to the server)."""


@dataclass(slots=True)
class Scan:
    """Where a walk over the directory is: which master (by index into ``nodes``) and its cursor."""

    nodes: list[str] = field(default_factory=list)
    node: int = 0
    cursor: int = 0
    started: bool = False

    @property
    def done(self) -> bool:
        return self.started and self.node >= len(self.nodes)


class Directory:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    async def page(self, scan: Scan, count: int = SCAN_COUNT) -> list[str]:
        """One ``SCAN`` call further along ``scan``: the agent ids it found (possibly none)."""
        keys = self.connection.keys

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

        return await self.connection.call(run, idempotent=True)

    async def agents(self, max_calls: int = 100_000) -> list[str]:
        """Every registered agent id, sorted (a full walk: for listings and the CLI)."""
        scan = Scan()
        found: set[str] = set()
        for _ in range(max_calls):
            found.update(await self.page(scan))
            if scan.done:
                break
        return sorted(found)


def _masters(client: Redis | RedisCluster) -> list[str]:
    if isinstance(client, RedisCluster):
        return [node.name for node in client.get_primaries()]
    return ["the server"]
