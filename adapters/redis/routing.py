"""Where a script call goes: one Redis, or the cluster node that serves its key's slot.

``Node`` is a small pool of redis-py connections to one server: at most ``limit`` connections, and a
caller that finds all of them busy waits its turn (first come, first served) instead of being refused.
A connection whose server closed it (a restart) is noticed when it is taken, and replaced; one that sat
idle is checked with a ``PING`` before use (redis-py's health check, ``HEALTH_CHECK_SECONDS``), so the
first call after a Redis restart does not fail.

``SingleRouter`` routes everything to the one server of the URL. ``ClusterRouter`` asks redis-py's
``RedisCluster`` topology (through ``driver.py``) which node serves a key's slot, follows ``MOVED`` by
updating that topology, and reloads the topology (single-flight) after a node failed: a failover is
picked up without a restart.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio import RedisCluster
from redis.exceptions import MovedError

from adapters.redis import driver
from adapters.redis.driver import Connection

HEALTH_CHECK_SECONDS = 0.05
"""A connection idle longer than this is PINGed (and reconnected once if that fails) before use; under
load connections are never idle that long, so it costs nothing there."""
_REFRESH_EVERY = 0.25
"""Seconds between two topology reloads at most (failing nodes ask for one on every error)."""


class Node:
    """A bounded pool of redis-py connections to one server; waiting for a free one queues."""

    def __init__(self, name: str, make: Callable[[], Connection], limit: int) -> None:
        self.name = name
        self._make = make
        self._limit = limit
        self._idle: list[tuple[Connection, float]] = []
        """Connections given back, with when: the most recent last (taken first)."""
        self._count = 0
        self._waiters: collections.deque[asyncio.Future[Connection | None]] = collections.deque()

    async def take(self) -> Connection:
        """A connected connection; waits (callers bound it with a timeout) while all are busy."""
        if self._idle:
            connection, _ = self._idle.pop()
        elif self._count < self._limit:
            self._count += 1
            connection = self._make()
        else:
            waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and (given := waiter.result()) is not None:
                    self.give(given)  # handed over just as the caller gave up: pass it on
                raise
            if handed is None:  # a slot was freed (a connection dropped): open a new one in it
                self._count += 1
                handed = self._make()
            connection = handed
        try:
            await driver.ready(connection)
        except BaseException:
            await self.drop(connection)
            raise
        return connection

    def give(self, connection: Connection) -> None:
        """Return a connection whose round trip ended well."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append((connection, time.monotonic()))

    async def drop(self, connection: Connection) -> None:
        """Discard a connection that failed, timed out or was abandoned mid-round-trip."""
        self._count -= 1
        await driver.discard(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            await driver.discard(connection)


class Router(Protocol):
    cluster: bool

    def node_for(self, key: str) -> Node: ...

    def node_at(self, host: str, port: int) -> Node: ...

    def primaries(self) -> list[Node]: ...

    async def moved(self, error: MovedError) -> None: ...

    async def refresh(self) -> None: ...

    async def close(self) -> None: ...


class SingleRouter:
    cluster = False

    def __init__(self, make: Callable[[], Connection], limit: int, name: str) -> None:
        self._node = Node(name, make, limit)

    def node_for(self, key: str) -> Node:
        return self._node

    def node_at(self, host: str, port: int) -> Node:
        return self._node

    def primaries(self) -> list[Node]:
        return [self._node]

    async def moved(self, error: MovedError) -> None:
        return None

    async def refresh(self) -> None:
        return None

    async def close(self) -> None:
        await self._node.close()


class ClusterRouter:
    cluster = True

    def __init__(self, client: RedisCluster, limit: int, overrides: dict[str, Any]) -> None:
        self.client = client
        self._limit = limit
        self._overrides = overrides
        self._nodes: dict[str, Node] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = 0.0

    def _node(self, server: driver.Server) -> Node:
        node = self._nodes.get(server.name)
        if node is None:
            make, settings = server.connection_class, {**server.connection_kwargs, **self._overrides}
            node = self._nodes[server.name] = Node(server.name, lambda: make(**settings), self._limit)
        return node

    def node_for(self, key: str) -> Node:
        return self._node(driver.slot_owner(self.client, key))

    def node_at(self, host: str, port: int) -> Node:
        return self._node(driver.server_at(self.client, host, port))

    def primaries(self) -> list[Node]:
        return [self._node(server) for server in driver.primaries(self.client)]

    async def moved(self, error: MovedError) -> None:
        await driver.follow_moved(self.client, error)

    async def refresh(self) -> None:
        """Reload the slot map from the cluster; concurrent callers share one reload, and reloads are
        at least ``_REFRESH_EVERY`` apart."""
        running = self._refreshing
        if running is None:
            if time.monotonic() - self._refreshed_at < _REFRESH_EVERY:
                return
            running = self._refreshing = asyncio.get_running_loop().create_task(self._reload())
        await asyncio.shield(running)

    async def _reload(self) -> None:
        try:
            await driver.reload_topology(self.client)
        finally:
            self._refreshed_at = time.monotonic()
            self._refreshing = None

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.close()
