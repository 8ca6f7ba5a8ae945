"""One Redis connection setup shared by the Redis registry and inbox store.

Two pools: a short-timeout one for ordinary commands (so an unreachable Redis gives a clear error in
bounded time) and one for blocking reads, whose socket timeout must outlast the longest block (redis-py
otherwise times out and re-issues the read, opening a new connection each time).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis.keys import Keys
from adapters.redis.scripts import Scripts
from broker.errors import BackendUnavailable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    prefix: str = "relay"
    connect_timeout: float = 2.0
    command_timeout: float = 5.0
    max_connections: int = 64
    max_blocking_connections: int = 512
    max_block: float = 25.0
    inbox_cap: int = 0
    """Unacknowledged envelopes an inbox may hold; 0 means no cap."""
    send_rate: float = 0.0
    """Sends per second each agent may make, shared by every worker on this Redis; 0 = unlimited."""
    send_burst: int = 0
    """Sends an agent may make at once above its rate (the token bucket's size)."""


class RedisConnection:
    """Clients, keys and scripts for one Redis; both Redis adapters share one instance."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.prefix)
        no_retry = Retry(NoBackoff(), 0)
        self.client: Redis = Redis.from_url(
            settings.url,
            decode_responses=True,
            socket_connect_timeout=settings.connect_timeout,
            socket_timeout=settings.command_timeout,
            health_check_interval=5,
            retry=no_retry,
            max_connections=settings.max_connections,
        )
        self.blocking: Redis = Redis.from_url(
            settings.url,
            decode_responses=True,
            socket_connect_timeout=settings.connect_timeout,
            socket_timeout=settings.max_block + settings.command_timeout,
            retry=no_retry,
            max_connections=settings.max_blocking_connections,
        )
        self.scripts = Scripts(self.client)
        self._users = 0

    async def open(self) -> None:
        self._users += 1

    async def close(self) -> None:
        self._users -= 1
        if self._users <= 0:
            self._users = 0
            await self.client.aclose()
            await self.blocking.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def call(self, operation: Callable[[], Awaitable[T]], *, idempotent: bool) -> T:
        """Run ``operation``; map Redis failures to ``BackendUnavailable``.

        Idempotent operations are retried once on a connection error: after a Redis restart the first
        use of each pooled connection fails. Sends are not retried, as a lost reply would duplicate.
        """
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            try:
                return await operation()
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if attempt + 1 < attempts and not isinstance(exc, RedisTimeoutError):
                    continue
                raise BackendUnavailable(
                    f"the message store is unavailable ({type(exc).__name__}); retry shortly"
                ) from exc
            except ResponseError:
                raise
            except RedisError as exc:
                raise BackendUnavailable(f"the message store failed: {exc}; retry shortly") from exc
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def connected(settings: RedisSettings) -> AsyncIterator[RedisConnection]:
    connection = RedisConnection(settings)
    await connection.open()
    try:
        yield connection
    finally:
        await connection.close()
