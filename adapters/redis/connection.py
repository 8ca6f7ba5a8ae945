"""One Redis client stack for every Redis adapter of a worker: redis-py, on one server or a cluster.

``RedisConnection`` finds out on first use whether the URL names a cluster node (``INFO cluster``): no
flag is needed, and any node of a cluster is a way in. Then:

- ``client``: a redis-py ``Redis`` (a blocking pool: callers queue for a free connection) or
  ``RedisCluster`` (slot routing, ``MOVED``/``ASK``, topology refresh) for the plain commands
  (registrations, listings, inspection, dead letters).
- ``script``: every Lua script call, auto-pipelined per node (``adapters/redis/pipeline.py``) on
  redis-py connections from per-node pools that queue instead of raising.
- ``wakeups``: the worker's one subscriber connection that wakes parked long-polls
  (``adapters/redis/wake.py``).

``rediss://`` (TLS) and ACL users (``redis://user:password@host``) work in both modes: the URL's
settings go to every connection, including those to cluster nodes the client discovers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis import driver
from adapters.redis.errors import STORE_FAILURES, is_refusal, store_error
from adapters.redis.keys import Keys
from adapters.redis.pipeline import AutoPipeline, ScriptPipeline
from adapters.redis.routing import HEALTH_CHECK_SECONDS, ClusterRouter, SingleRouter
from adapters.redis.scripts import Script, ScriptLoader, Scripts
from adapters.redis.wake import Wakeups
from broker.limits import (
    DEFAULT_HISTORY_RETENTION_MS,
    DEFAULT_IDEMPOTENCY_WINDOW_MS,
    DEFAULT_STATUS_RETENTION_MS,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    prefix: str = "relay"
    connect_timeout: float = 2.0
    command_timeout: float = 5.0
    max_connections: int = 64
    """Connections per Redis node for script calls, and as many again for plain commands."""
    inbox_cap: int = 0
    """Unacknowledged envelopes an inbox may hold; 0 means no cap."""
    send_rate: float = 0.0
    """Sends per second each agent may make, shared by every worker on this Redis; 0 = unlimited."""
    send_burst: int = 0
    """Sends an agent may make at once above its rate (the token bucket's size)."""
    wait_replicas: int = 0
    """Replicas that must hold a send, acknowledgement or registration before it is answered."""
    max_deliveries: int = 0
    """Hand-outs of an unacknowledged envelope before fetch dead-letters it; 0 = no limit."""
    idempotency_window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS
    """How long an idempotency key is remembered."""
    status_retention_ms: int = DEFAULT_STATUS_RETENTION_MS
    """How long what a sender sent is kept for its status; 0 = keep no status."""
    history_retention_ms: int = DEFAULT_HISTORY_RETENTION_MS
    """How long what left an inbox stays in its agent's history; 0 = keep no history."""
    history_max_bytes: int = 0
    """Bytes of fields one agent's history keeps at most (its oldest go first); 0 = no cap."""
    max_waits_per_agent: int = 16
    """Long-polls one agent may have parked on this worker at once."""
    max_waits: int = 10_000
    """Long-polls this worker holds parked at once, all agents together."""


@dataclass(slots=True)
class _Stack:
    client: Redis | RedisCluster
    pipeline: ScriptPipeline
    cluster: bool


class RedisConnection:
    """Clients, keys and scripts for one Redis (or cluster); the Redis adapters of a worker share one."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.scripts = Scripts()
        self.wakeups = Wakeups(self)
        self._loader = ScriptLoader()
        self._stack: _Stack | None = None
        self._resolving: asyncio.Task[_Stack] | None = None
        self._users = 0
        self._plain = asyncio.Semaphore(settings.max_connections)

    # -- lifecycle ---------------------------------------------------------------------------------
    # A Relay's registry, inbox and notice store name this connection as their ``backend``: the Relay
    # opens and closes it once for the three. An adapter used beside a Relay on the same connection
    # (a delivery queue, the policy store, the operator view) or alone in a command opens and closes it
    # too, so it is closed when the last of its users closes it.

    async def open(self) -> None:
        self._users += 1

    async def close(self) -> None:
        self._users -= 1
        if self._users > 0:
            return
        self._users = 0
        await self.wakeups.close()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.pipeline.close()
            await stack.client.aclose()

    async def stack(self) -> _Stack:
        """The client stack, set up on first use (one probe of the URL, shared by concurrent callers)."""
        if self._stack is not None:
            return self._stack
        if self._resolving is None:
            self._resolving = asyncio.get_running_loop().create_task(self._resolve())
        try:
            return await asyncio.shield(self._resolving)
        finally:
            if self._resolving is not None and self._resolving.done():
                self._resolving = None

    async def _resolve(self) -> _Stack:
        s = self.settings
        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": s.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        probe = Redis.from_url(s.url, socket_timeout=s.command_timeout, **common)
        try:
            async with asyncio.timeout(s.command_timeout + s.connect_timeout):
                cluster = await _cluster_enabled(probe)
        finally:
            await probe.aclose()
        stack: _Stack
        if cluster:
            client = RedisCluster.from_url(
                s.url,
                socket_timeout=s.command_timeout,
                max_connections=s.max_connections * 2,
                require_full_coverage=False,
                **common,
            )
            async with asyncio.timeout(s.command_timeout + s.connect_timeout):
                await client.initialize()
            router = ClusterRouter(client, s.max_connections, _scripted(**common))
            stack = _Stack(
                client,
                AutoPipeline(router, self._loader, self.scripts.library, s.command_timeout, s.wait_replicas),
                True,
            )
        else:
            factory = ConnectionPool.from_url(s.url, **_scripted(**common))
            pool = BlockingConnectionPool.from_url(
                s.url,
                socket_timeout=s.command_timeout,
                max_connections=s.max_connections,
                timeout=s.command_timeout,
                health_check_interval=5,
                **common,
            )
            plain = Redis.from_pool(pool)  # closing the client closes its pool
            name, make = driver.connection_factory(factory)
            router_single = SingleRouter(make, s.max_connections, name)
            stack = _Stack(
                plain,
                AutoPipeline(
                    router_single, self._loader, self.scripts.library, s.command_timeout, s.wait_replicas
                ),
                False,
            )
        self._stack = stack
        return stack

    # -- calls -------------------------------------------------------------------------------------

    async def script(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        idempotent: bool,
        durable: bool = False,
    ) -> Any:
        """Run ``script`` (auto-pipelined). ``RELAY_*`` refusals come back as ``ResponseError``; every
        other failure as a ``RelayError`` (``store_error``). Idempotent calls are sent once more after a
        connection failure; ``durable`` ones are answered after ``wait_replicas`` replicas hold them."""
        stack = self._stack or await self._stack_or_unavailable()
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            try:
                return await stack.pipeline.run(script, keys, args, durable=durable)
            except ResponseError as exc:
                if is_refusal(exc):
                    raise
                raise store_error(exc) from exc
            except STORE_FAILURES as exc:
                if attempt + 1 < attempts and not isinstance(exc, TimeoutError | RedisTimeoutError):
                    continue
                raise store_error(exc) from exc
        raise AssertionError("unreachable")

    async def call(self, operation: Callable[[Redis | RedisCluster], Awaitable[T]], *, idempotent: bool) -> T:
        """Run ``operation(client)`` with a plain-command client; Redis failures become ``RelayError``
        (``store_error``). Idempotent operations are retried once on a connection error: after a Redis
        restart the first use of a pooled connection can fail."""

        async def run(stack: _Stack) -> T:
            async with self._plain:
                return await operation(stack.client)

        return await self._retried(run, 2 if idempotent else 1)

    async def commands(self, calls: Sequence[tuple[str, tuple[str | int, ...]]]) -> list[Any]:
        """Read-only plain commands, ``(key, (command, *args))`` each, pipelined per node (one round
        trip per node); their replies in order. Any failure, an error reply too, is a ``RelayError``
        (``store_error``); sent once more after a connection failure, like ``call``."""

        async def run(stack: _Stack) -> list[Any]:
            return await stack.pipeline.commands(calls)

        replies = await self._retried(run, 2)
        for reply in replies:
            if isinstance(reply, Exception):
                raise store_error(reply) from reply
        return replies

    async def _retried(self, run: Callable[[_Stack], Awaitable[T]], attempts: int) -> T:
        """``run(stack)``, sent again (up to ``attempts`` in all) after a connection failure, never
        after an error reply or a timeout (it may have run); failures become ``store_error``'s.
        ``script`` keeps its own copy of this loop: it runs on every send, fetch and acknowledgement,
        where a closure per call is a cost."""
        stack = self._stack or await self._stack_or_unavailable()
        for attempt in range(attempts):
            try:
                return await run(stack)
            except STORE_FAILURES as exc:
                if attempt + 1 < attempts and not isinstance(
                    exc, ResponseError | TimeoutError | RedisTimeoutError
                ):
                    continue
                raise store_error(exc) from exc
        raise AssertionError("unreachable")

    async def _stack_or_unavailable(self) -> _Stack:
        try:
            return await self.stack()
        except (*STORE_FAILURES, TimeoutError) as exc:
            raise store_error(exc) from exc

    async def delete_prefix(self) -> int:
        """Delete every key under this connection's prefix, on every master; the number deleted. For
        examples and tests, which run on a throw-away prefix."""
        pattern = self.keys.pattern()

        async def run(client: Redis | RedisCluster) -> int:
            found: list[str] = []
            if isinstance(client, RedisCluster):
                for node in client.get_primaries():
                    cursor = 0
                    for _ in range(1_000_000):
                        cursor, keys = await node.execute_command(
                            "SCAN", cursor, "MATCH", pattern, "COUNT", 1000
                        )
                        found += [str(k) for k in keys]
                        if int(cursor) == 0:
                            break
            else:
                found = [str(k) async for k in client.scan_iter(match=pattern, count=1000)]
            for start in range(0, len(found), 500):
                await client.delete(*found[start : start + 500])
            return len(found)

        return await self.call(run, idempotent=True)

    @property
    def cluster(self) -> bool:
        return self._stack is not None and self._stack.cluster

    @property
    def single_node(self) -> bool:
        """True once the first call found one Redis (not a cluster): scripts may span slots then."""
        return self._stack is not None and not self._stack.cluster

    async def ping(self) -> bool:
        """Ready: every master answers and, on a cluster, every slot is served (``cluster_state:ok``)."""
        try:
            stack = await self.stack()
            async with asyncio.timeout(self.settings.command_timeout):
                if not stack.cluster:
                    return bool(await stack.pipeline.command(None, "PING"))
                await stack.pipeline.on_each_primary("PING")
                info = str(await stack.pipeline.command(None, "CLUSTER", "INFO"))
                return "cluster_state:ok" in info
        except (*STORE_FAILURES, TimeoutError):
            return False


def _scripted(**common: Any) -> dict[str, Any]:
    """Settings of the script-call connections: no socket timeout (one timeout covers a whole round
    trip), a PING before using a connection that sat idle, reconnected once when that fails."""
    return {
        **common,
        "socket_timeout": None,
        "health_check_interval": HEALTH_CHECK_SECONDS,
        "retry": Retry(NoBackoff(), 1),
    }


async def _cluster_enabled(probe: Redis) -> bool:
    try:
        info = await probe.info("cluster")
    except ResponseError:  # INFO not allowed for this ACL user: ask the cluster itself
        try:
            await probe.execute_command("CLUSTER", "MYID")  # type: ignore[no-untyped-call]
        except ResponseError:
            return False
        return True
    return bool(int(info.get("cluster_enabled", 0)))


@contextlib.asynccontextmanager
async def connected(settings: RedisSettings) -> AsyncIterator[RedisConnection]:
    connection = RedisConnection(settings)
    await connection.open()
    try:
        yield connection
    finally:
        await connection.close()
