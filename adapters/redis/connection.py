"""One Redis connection setup shared by the Redis registry and inbox store.

Two pools: a short-timeout one for ordinary commands (so an unreachable Redis gives a clear error in
bounded time) and one for blocking reads, whose socket timeout must outlast the longest block (redis-py
otherwise times out and re-issues the read, opening a new connection each time).

Script calls are auto-pipelined (``RedisConnection.evalsha``): the calls that tasks make in the same
event-loop turn go out as one pipeline, one write and one round trip on one pooled connection. Each
script stays atomic and gets its own reply or error; under concurrency this cuts the client's cost per
call several times over (see docs/performance.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis.keys import Keys
from adapters.redis.scripts import Scripts
from adapters.redis.wire import WireDialer, WireProtocol
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
        # the auto-pipeline's own pool: no per-read socket timeout (one timeout covers a whole
        # pipeline, see AutoPipeline), same limits otherwise
        self.pipelined: Redis = Redis.from_url(
            settings.url,
            decode_responses=True,
            socket_connect_timeout=settings.connect_timeout,
            socket_timeout=None,
            health_check_interval=5,
            retry=no_retry,
            max_connections=settings.max_connections,
        )
        self.scripts = Scripts(self.client)
        self.pipeline = AutoPipeline(self.pipelined, settings.command_timeout, settings.max_connections)
        self._users = 0

    async def open(self) -> None:
        self._users += 1

    async def close(self) -> None:
        self._users -= 1
        if self._users <= 0:
            self._users = 0
            await self.client.aclose()
            await self.blocking.aclose()
            self.pipeline.close()
            await self.pipelined.aclose()

    def evalsha(self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | int]) -> Awaitable[Any]:
        """Run ``script`` (auto-pipelined with the other script calls of this event-loop turn)."""
        return self.pipeline.evalsha(script, len(keys) + len(args) + 1, pack_args((len(keys), *keys, *args)))

    def evalsha_packed(self, script: AsyncScript, count: int, packed: bytes) -> Awaitable[Any]:
        """``evalsha`` with its arguments already encoded: ``packed`` is ``pack_args((numkeys, *keys,
        *args))`` (or the same bytes built in parts), ``count`` the number of values it holds."""
        return self.pipeline.evalsha(script, count, packed)

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


_Call = tuple[AsyncScript, int, bytes, "asyncio.Future[Any]"]
_MAX_BATCH = 8
"""Calls per pipeline at most; more queued calls in one turn go out as several pipelines, so Redis
runs one while this process handles the replies of another (measured: 8 beats 4 and 128 by 15-30%
at 16 concurrent callers; see docs/performance.md)."""


def bulk(text: str) -> bytes:
    """One RESP bulk string: ``text`` as UTF-8, as redis-py would encode it."""
    data = text.encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack_args(args: Sequence[str | int]) -> bytes:
    """RESP bulk strings for ``args`` (str as UTF-8, int in decimal), as redis-py would encode them."""
    out = []
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else b"%d" % arg
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


def _evalsha_commands(calls: Iterable[tuple[AsyncScript, int, bytes]]) -> bytes:
    """``EVALSHA sha <count values>`` for each call, its values already encoded in ``packed``."""
    parts: list[bytes] = []
    for script, count, packed in calls:
        parts.append(_evalsha_head(script.sha, count))
        parts.append(packed)
    return b"".join(parts)


def _evalsha_head(sha: str, count: int) -> bytes:
    """The start of ``EVALSHA sha <count values>``; the packed values follow."""
    return b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%b\r\n" % (count + 2, len(sha), sha.encode())


class AutoPipeline:
    """Coalesces concurrent script calls into pipelines.

    A call made while no other script call is queued or in flight runs at once. A call made while
    others are busy is queued; the first queued call of an event-loop turn schedules a flush for the
    end of that turn, which writes every queued call as one pipeline on one pooled connection (one
    write, one round trip). Redis runs each script atomically, one after another, and every call gets
    its own reply or ``ResponseError``; a connection failure or a timeout (``timeout`` seconds for the
    whole pipeline) fails every call of that pipeline, and each caller then decides whether to retry,
    exactly as for a single command. Scripts the server does not know (``NOSCRIPT``, e.g. after a
    restart) are loaded and their calls run once more.

    Commands go out on ``wire`` connections (``adapters/redis/wire.py``) with ``client``'s pool
    settings, at most ``max_connections`` at once, or on redis-py connections from that pool when its
    URL needs more than the wire module does (TLS); either way one timeout covers a whole pipeline.
    """

    def __init__(self, client: Redis, timeout: float, max_connections: int) -> None:
        self._client = client
        self._timeout = timeout
        self._queue: list[_Call] | None = None
        self._busy = 0
        self._running: set[asyncio.Task[None]] = set()
        pool = client.connection_pool
        self._dialer = WireDialer.for_pool(pool.connection_class, pool.connection_kwargs)
        self._idle: list[WireProtocol] = []
        self._max_connections = max_connections
        self._in_use = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._timers: dict[WireProtocol, asyncio.TimerHandle] = {}
        self._closing = False

    def close(self) -> None:
        """Close the idle wire connections (in-flight ones close when their round trip ends)."""
        self._closing = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.fail(RedisConnectionError("the relay is closing"))

    async def evalsha(self, script: AsyncScript, count: int, packed: bytes) -> Any:
        """Run ``script`` with ``count`` values (numkeys, keys, args) already encoded in ``packed``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = (script, count, packed, future)
        if not self._busy:
            if not self._send_now([call]):
                self._busy += 1
                try:
                    (reply,) = await self._execute([(script, count, packed)])
                finally:
                    self._busy -= 1
                if isinstance(reply, Exception):
                    raise reply
                return reply
        else:
            queue = self._queue
            if queue is None:
                queue = self._queue = []
                loop.call_soon(self._flush)
            queue.append(call)
            if len(queue) >= _MAX_BATCH:
                self._flush()
        reply = await future
        if isinstance(reply, Exception):  # wire connections hand error replies over as values
            if not isinstance(reply, NoScriptError):
                raise reply
            (reply,) = await self._execute([(script, count, packed)])  # loads the script, runs again
            if isinstance(reply, Exception):
                raise reply
        return reply

    def _flush(self) -> None:
        calls, self._queue = self._queue, None
        if not calls or self._send_now(calls):
            return
        self._busy += 1
        task = asyncio.get_running_loop().create_task(self._run(calls))
        self._running.add(task)
        task.add_done_callback(self._done)

    def _send_now(self, calls: list[_Call]) -> bool:
        """Write ``calls`` at once on an idle wire connection, if there is one and a free slot: their
        futures get the replies straight from the connection (no task, no extra event-loop turn).
        False when that is not possible; the caller then takes the path that can wait and connect."""
        if self._dialer is None or self._in_use >= self._max_connections:
            return False
        connection = self._take_idle()
        if connection is None:
            return False
        data = _evalsha_commands((script, count, packed) for script, count, packed, _ in calls)
        self._in_use += 1
        self._busy += 1
        timer = asyncio.get_running_loop().call_later(self._timeout, self._expire, connection)
        self._timers[connection] = timer
        try:
            connection.request_into(data, [call[3] for call in calls], self._settled)
        except RedisConnectionError:
            self._settled(connection, False)
            return False
        return True

    def _settled(self, connection: WireProtocol, ok: bool) -> None:
        timer = self._timers.pop(connection, None)
        if timer is not None:
            timer.cancel()
        self._busy -= 1
        if ok:
            self._give_back(connection)
        self._release_slot()

    def _take_idle(self) -> WireProtocol | None:
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:  # a server restart closed the others: EOF marks them
                return candidate
        return None

    def _give_back(self, connection: WireProtocol) -> None:
        """Keep a connection whose round trip ended well for the next one, unless closing."""
        if self._closing:
            connection.fail(RedisConnectionError("the relay is closing"))
        elif not connection.closed:
            self._idle.append(connection)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._busy -= 1
        self._running.discard(task)

    async def _roundtrip(self, data: bytes, count: int) -> list[Any]:
        """Write ``data`` (``count`` commands) at once and read ``count`` replies."""
        if self._dialer is None:
            return await self._roundtrip_pooled(data, count)
        await self._take_slot()
        connection = None
        try:
            connection = self._take_idle() or await self._dialer.connect()
            futures = connection.request(data, count)
            timer = asyncio.get_running_loop().call_later(self._timeout, self._expire, connection)
            try:
                replies = [await future for future in futures]
            finally:
                timer.cancel()
            self._give_back(connection)
            connection = None
            return replies
        finally:
            if connection is not None:  # failed, timed out or cancelled mid-round-trip: unusable
                connection.fail(RedisConnectionError("round trip abandoned"))
            self._release_slot()

    async def _take_slot(self) -> None:
        """One of the ``max_connections`` wire connections; waiting for one is bounded like the rest."""
        if self._in_use < self._max_connections:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout(self._timeout):
                await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():  # handed a slot just as time ran out
                self._release_slot()
            raise self._timed_out() from None

    def _release_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter as it is
                return
        self._in_use -= 1

    def _expire(self, connection: WireProtocol) -> None:
        connection.fail(self._timed_out())

    async def _roundtrip_pooled(self, data: bytes, count: int) -> list[Any]:
        pool = self._client.connection_pool
        connection = None
        try:
            # One timeout, restarted once connected: checking out a connection and the round trip
            # each get the full ``timeout``. Connecting reads (CLIENT SETINFO, health check) with this
            # pool's socket timeout, None: unbounded, it would hang every call while Redis accepts but
            # never answers (SIGSTOP).
            async with asyncio.timeout(self._timeout) as deadline:
                connection = await pool.get_connection()  # type: ignore[no-untyped-call]
                deadline.reschedule(asyncio.get_running_loop().time() + self._timeout)
                await connection.send_packed_command(data)
                replies: list[Any] = []
                for _ in range(count):
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            return replies
        except TimeoutError:
            if connection is not None:
                await connection.disconnect(nowait=True)
            raise self._timed_out() from None
        except BaseException:
            if connection is not None:
                await connection.disconnect(nowait=True)
            raise
        finally:
            if connection is not None:
                await pool.release(connection)

    def _timed_out(self) -> RedisTimeoutError:
        return RedisTimeoutError(f"no reply from the message store within {self._timeout}s")

    async def _execute(self, calls: Sequence[tuple[AsyncScript, int, bytes]]) -> list[Any]:
        replies = await self._roundtrip(_evalsha_commands(calls), len(calls))
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                try:
                    async with asyncio.timeout(self._timeout):
                        script.sha = await self._client.script_load(script.script)
                except TimeoutError:
                    raise self._timed_out() from None
            again = await self._roundtrip(_evalsha_commands(calls[i] for i in missing), len(missing))
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _run(self, calls: list[_Call]) -> None:
        try:
            replies = await self._execute([(script, count, packed) for script, count, packed, _ in calls])
        except asyncio.CancelledError:
            for *_, future in calls:
                future.cancel()
            raise
        except Exception as exc:
            for *_, future in calls:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), reply in zip(calls, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)
