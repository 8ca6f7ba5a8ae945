"""Lean connections for the auto-pipeline: an ``asyncio.Protocol`` that parses replies with hiredis as
bytes arrive and hands them to the waiting calls in order.

redis-py's asyncio connection reads through ``StreamReader`` and wraps every reply in its own
checks; with the pool checkout and a timeout context per round trip that was about half of a worker's
CPU spent on a send beyond what a no-op MCP tool costs (profile in docs/performance.md). A round trip
here is one ``transport.write``, one ``data_received`` and one future per call.

Only plain TCP and unix-socket URLs are served this way (optionally with AUTH and SELECT); anything
else (TLS, RESP3, ...) keeps redis-py's connections. Replies are what redis-py returns for the same
command with ``decode_responses=True``: hiredis parses both, and error replies become the same
exception classes (``BaseParser.parse_error``), returned as values like a pipeline's.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import AuthenticationError, InvalidResponse, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# connection settings this module understands; a pool with any other one keeps redis-py's connections
_UNDERSTOOD = frozenset(
    {
        "host",
        "port",
        "path",
        "username",
        "password",
        "db",
        "decode_responses",
        "socket_connect_timeout",
        "socket_timeout",
        "health_check_interval",
        "retry",
        # redis-py's own bookkeeping: copies of the above, and push notifications that need RESP3
        "orig_host_address",
        "orig_socket_connect_timeout",
        "orig_socket_timeout",
        "himport_registry",
        "maint_notifications_config",
        "maint_notifications_pool_handler",
    }
)


class WireProtocol(asyncio.Protocol):
    """One Redis connection. ``request`` writes commands and returns one future per reply;
    ``request_into`` resolves futures the caller made, and calls ``settled`` once they all are."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader(
            protocolError=InvalidResponse, replyError=BaseParser.parse_error, encoding="utf-8"
        )
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._settled: Callable[[WireProtocol, bool], None] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        try:
            while waiting:
                reply = reader.gets()
                if reply is False:
                    return
                future = waiting.popleft()
                if not future.done():
                    future.set_result(reply)
            if reader.gets() is not False:
                raise InvalidResponse("a reply nobody asked for")
        except InvalidResponse as exc:
            self.fail(RedisConnectionError(f"the message store sent something unreadable: {exc}"))
            return
        settled, self._settled = self._settled, None
        if settled is not None:
            settled(self, True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._fail_waiting(RedisConnectionError("connection to the message store lost"))

    def request(self, data: bytes, count: int) -> list[asyncio.Future[Any]]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(count)]
        self.request_into(data, futures)
        return futures

    def request_into(
        self,
        data: bytes,
        futures: Sequence[asyncio.Future[Any]],
        settled: Callable[[WireProtocol, bool], None] | None = None,
    ) -> None:
        """Write ``data`` and resolve ``futures`` with its replies in order (error replies are values);
        then call ``settled(self, True)``, or ``settled(self, False)`` if the connection failed first."""
        transport = self._transport
        if transport is None or self.closed:
            raise RedisConnectionError("connection to the message store is closed")
        self._waiting.extend(futures)
        self._settled = settled
        transport.write(data)

    def fail(self, error: Exception) -> None:
        """Fail every waiting call with ``error`` and drop the connection (its replies are lost)."""
        self.closed = True
        self._fail_waiting(error)
        if self._transport is not None:
            self._transport.abort()

    def _fail_waiting(self, error: Exception) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        settled, self._settled = self._settled, None
        if settled is not None:
            settled(self, False)


class WireDialer:
    """Opens ``WireProtocol`` connections with a pool's settings (see ``for_pool``)."""

    def __init__(self, settings: Mapping[str, Any], unix: bool) -> None:
        self._host = str(settings.get("host", "localhost"))
        self._port = int(settings.get("port", 6379))
        self._path = str(settings["path"]) if unix else None
        self._connect_timeout = settings.get("socket_connect_timeout")
        handshake = []
        password, username = settings.get("password"), settings.get("username")
        if password:
            handshake.append(("AUTH", username, password) if username else ("AUTH", password))
        if int(settings.get("db") or 0):
            handshake.append(("SELECT", str(int(settings["db"]))))
        self._handshake = [tuple(part for part in command if part is not None) for command in handshake]

    @classmethod
    def for_pool(cls, connection_class: type, settings: Mapping[str, Any]) -> WireDialer | None:
        """A dialer for a redis-py pool's connections, or None when they need more than this module
        does (TLS, RESP3, client names, ...)."""
        if not set(settings) <= _UNDERSTOOD or not settings.get("decode_responses"):
            return None
        if connection_class is UnixDomainSocketConnection and settings.get("path"):
            return cls(settings, unix=True)
        if connection_class is Connection:
            return cls(settings, unix=False)
        return None

    async def connect(self) -> WireProtocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._path is not None:
                    _, protocol = await loop.create_unix_connection(WireProtocol, self._path)
                else:
                    _, protocol = await loop.create_connection(WireProtocol, self._host, self._port)
                if self._handshake:
                    data = b"".join(_command(*command) for command in self._handshake)
                    for reply in [await f for f in protocol.request(data, len(self._handshake))]:
                        if isinstance(reply, ResponseError):
                            protocol.fail(RedisConnectionError("handshake refused"))
                            raise AuthenticationError(str(reply))
        except TimeoutError:
            raise RedisTimeoutError("timed out connecting to the message store") from None
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to the message store: {exc}") from exc
        return protocol


def _command(*parts: str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)
