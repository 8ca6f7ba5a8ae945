"""Wake-ups for parked long-polls: one subscriber connection per worker, any number of waiters.

The scripts that put something in an inbox (``send_append``, ``requeue``) or change who may read it
(``register``) ``PUBLISH`` the agent id on ``Keys.wake_channel()``. Each worker holds one ``SUBSCRIBE``
connection to that channel (on a cluster to one master: a plain ``PUBLISH`` reaches every node) and
fans each message out to its in-process waiters, futures keyed by agent: a parked long-poll holds no
Redis connection. A woken waiter only learns that something *may* have changed: the caller looks
again (the fetch script checks the session again, so a superseded session gets ``session_superseded``,
not mail).

When the subscription is lost (Redis restarted, a failover) every waiter is woken to look again, and
again once the subscription is back, so nothing published in between is missed. ``close`` wakes every
waiter at once with "stop". Caps: ``max_waits_per_agent`` waiters per agent and ``max_waits`` in all;
one more is refused with ``TooManyWaits`` before it waits, so no agent can make another's call fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import RedisError

from broker.errors import TooManyWaits

if TYPE_CHECKING:
    from adapters.redis.connection import RedisConnection

log = logging.getLogger("relay.redis.wake")

_RETRY_MAX = 1.0
"""Seconds between two attempts to subscribe again, at most."""


class Parked:
    """One parked waiter (``Wakeups.park``); ``wait`` until woken, timed out, or the worker closes."""

    def __init__(self, wakeups: Wakeups, agent: str) -> None:
        self._wakeups = wakeups
        self.agent = agent
        self._future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def rearm(self) -> None:
        """Forget earlier wake-ups; call before looking, so a wake-up after the look is not missed."""
        if self._future.done():
            self._future = asyncio.get_running_loop().create_future()

    @property
    def future(self) -> asyncio.Future[bool]:
        return self._future

    async def wait(self, seconds: float) -> bool:
        """True when woken (look again), False when ``seconds`` passed or the worker is closing."""
        if self._wakeups.closed:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                return await asyncio.shield(self._future)
        return False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._wakeups.unpark(self)


class Wakeups:
    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self._waiters: dict[str, set[Parked]] = {}
        self._total = 0
        self._task: asyncio.Task[None] | None = None
        self._watchers: list[Callable[[str], None]] = []
        self._on_subscribed: list[Callable[[], None]] = []
        self.subscribed = False
        self.closed = False

    def count(self, agent: str | None = None) -> int:
        """Waiters parked now: ``agent``'s, or all."""
        if agent is None:
            return self._total
        return len(self._waiters.get(agent, ()))

    def park(self, agent: str) -> Parked:
        """Register a waiter for ``agent`` (use it as a context manager); starts the subscriber.

        Raises:
            TooManyWaits: ``agent`` already has ``max_waits_per_agent`` waiters here, or this worker
            ``max_waits``.
        """
        settings = self._connection.settings
        mine = self._waiters.get(agent)
        if mine is not None and len(mine) >= settings.max_waits_per_agent:
            raise TooManyWaits(agent, settings.max_waits_per_agent)
        if self._total >= settings.max_waits:
            raise TooManyWaits(agent, settings.max_waits, per_agent=False)
        parked = Parked(self, agent)
        self._waiters.setdefault(agent, set()).add(parked)
        self._total += 1
        if self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._subscribe_forever())
        return parked

    def watch(self, callback: Callable[[str], None], subscribed: Callable[[], None] | None = None) -> None:
        """Call ``callback(agent)`` for every wake-up from now on, and ``subscribed()`` whenever the
        subscription is made or made again (wake-ups published before may have been missed); both
        must return at once. Starts the subscriber."""
        self._watchers.append(callback)
        if subscribed is not None:
            self._on_subscribed.append(subscribed)
        if self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._subscribe_forever())

    def unpark(self, parked: Parked) -> None:
        mine = self._waiters.get(parked.agent)
        if mine is None or parked not in mine:
            return
        mine.discard(parked)
        self._total -= 1
        if not mine:
            del self._waiters[parked.agent]

    def wake(self, agent: str) -> None:
        for callback in self._watchers:
            callback(agent)
        for parked in self._waiters.get(agent, ()):
            if not parked.future.done():
                parked.future.set_result(True)

    def wake_all(self, value: bool = True) -> None:
        for parked in self._every():
            if not parked.future.done():
                parked.future.set_result(value)

    def _every(self) -> Iterator[Parked]:
        for waiters in list(self._waiters.values()):
            yield from list(waiters)

    def stop_waiting(self) -> None:
        """Answer every waiter at once ("stop waiting"), and every later one too (shutting down)."""
        self.closed = True
        self.wake_all(False)

    async def close(self) -> None:
        """``stop_waiting`` and drop the subscription."""
        self.stop_waiting()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _subscribe_forever(self) -> None:
        delay = 0.05
        while not self.closed:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                if self.subscribed:
                    log.warning("wake-up subscription lost (%s); parked long-polls look again", exc)
            finally:
                if self.subscribed:
                    self.subscribed = False
                    self.wake_all()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)

    async def _listen(self) -> None:
        client = await subscriber_client(self._connection)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(self._connection.keys.wake_channel())
                while not self.closed:
                    message: dict[str, Any] | None = await pubsub.get_message(timeout=5.0)
                    if message is None:
                        await pubsub.ping()
                        continue
                    kind = message.get("type")
                    if kind == "message":
                        self.wake(str(message.get("data")))
                    elif kind == "subscribe":
                        self.subscribed = True
                        self.wake_all()  # anything published before this moment: look again
                        for subscribed in self._on_subscribed:
                            subscribed()
        finally:
            await client.aclose()


async def subscriber_client(connection: RedisConnection) -> Redis:
    """A client of its own for a ``SUBSCRIBE`` on ``connection``'s Redis (on a cluster, one master:
    a plain ``PUBLISH`` reaches every node)."""
    stack = await connection.stack()
    settings = connection.settings
    if not stack.cluster:
        return Redis.from_url(
            settings.url,
            decode_responses=True,
            socket_connect_timeout=settings.connect_timeout,
            socket_timeout=settings.command_timeout + 5,
            health_check_interval=5,
        )
    nodes = stack.client.get_primaries()  # type: ignore[union-attr]
    node = nodes[id(connection) % len(nodes)]
    kwargs = {**node.connection_kwargs, "socket_timeout": settings.command_timeout + 5}
    return Redis(connection_pool=ConnectionPool(connection_class=node.connection_class, **kwargs))
