"""The connection limits of ``relay serve``'s HTTP server: uvicorn's httptools protocol plus the
bounds it lacks.

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` seconds and nothing else: a
fresh connection that never sends, headers or a body that dribble in (httptools accumulates a header
of any size) and an unbounded number of connections are all kept. This protocol closes a fresh
connection after the same idle time, answers 408 to headers not complete within ``header_timeout``
and to a body not complete within ``body_timeout`` of its headers, 431 to more than
``max_header_bytes`` of request line and headers (counted as they arrive, so at most one read beyond
the limit is ever held), and 503 to a connection beyond ``max_connections``, each closing the
connection. The body size limit is the front's (``broker.front.guards.BodyGuard``).

A request only records its deadline (one clock read); one sweep per server, a few times within the
shortest limit, closes what is overdue, so no timer is set per request.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broker.front.http_limits import ANSWERED_BY_SERVER, HttpLimits
from broker.front.jsonrpc import INVALID_REQUEST, error_bytes

log = logging.getLogger("relay.serve")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
FILES_BESIDES_CONNECTIONS = 1024
"""Descriptors ``relay serve`` needs besides its HTTP connections: the Redis pools, the log, ..."""
_HEADERS, _BODY = 1, 2


def protocol_for(limits: HttpLimits) -> type[asyncio.Protocol]:
    """The uvicorn ``http`` protocol class enforcing ``limits``."""
    every = max(0.05, min(1.0, limits.header_timeout / 4, limits.body_timeout / 4))
    sweeping: list[asyncio.TimerHandle] = []

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = 0  # _HEADERS or _BODY while a request is on the clock
            self._deadline = 0.0
            self._header_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning("connection refused: %d open (--max-connections)", limits.max_connections)
                self._reject(
                    503,
                    f"too many connections: at most {limits.max_connections} at once "
                    "(relay serve --max-connections); retry shortly",
                    "--max-connections",
                    limits.max_connections,
                )
                return
            # uvicorn arms its keep-alive timer only after a response: a silent new connection gets it too,
            # bounded by the time its first request's headers may take
            self.timeout_keep_alive_task = self.loop.call_later(
                min(self.timeout_keep_alive, limits.header_timeout), self.timeout_keep_alive_handler
            )
            if not sweeping:
                sweeping.append(self.loop.call_later(every, _sweep, self.loop, self.connections))

        def data_received(self, data: bytes) -> None:
            counting = self._phase == _HEADERS
            super().data_received(data)
            if self.transport.is_closing():
                if self._phase == _BODY:  # a malformed body (uvicorn answered 400 and logged it)
                    self._answered()
                return
            if not (counting or self._phase == _HEADERS):
                return
            self._header_bytes += len(data)
            if self._phase == _HEADERS and self._header_bytes > limits.max_header_bytes:
                log.info(
                    "request refused: headers over %d bytes (--max-header-bytes)", limits.max_header_bytes
                )
                self._reject(
                    431,
                    f"the request line and headers are over {limits.max_header_bytes} bytes "
                    "(relay serve --max-header-bytes)",
                    "--max-header-bytes",
                    limits.max_header_bytes,
                )

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = _HEADERS
            self._deadline = time.monotonic() + limits.header_timeout
            self._header_bytes = 0

        def on_headers_complete(self) -> None:
            self._phase = _BODY
            self._deadline = time.monotonic() + limits.body_timeout
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._phase = 0
            super().on_message_complete()

        def overdue(self, now: float) -> None:
            """Answer and close a request past its deadline."""
            if not self._phase or now < self._deadline or self.transport.is_closing():
                return
            if self._phase == _HEADERS:
                log.info(
                    "request refused: headers not complete within %s s (--header-timeout)",
                    limits.header_timeout,
                )
                self._reject(
                    408,
                    f"the request headers did not arrive within {limits.header_timeout:g} s "
                    "(relay serve --header-timeout)",
                    "--header-timeout",
                    limits.header_timeout,
                )
                return
            log.info("request refused: body not complete within %s s (--body-timeout)", limits.body_timeout)
            cycle = self.cycle
            if cycle is not None and cycle.response_started:  # answered already: only the body is late
                self.transport.close()
                return
            self._answered()
            self._reject(
                408,
                f"the request body did not arrive within {limits.body_timeout:g} s "
                "(relay serve --body-timeout)",
                "--body-timeout",
                limits.body_timeout,
            )

        def _answered(self) -> None:
            """Tell the front this request was answered and logged here (it logs nothing more)."""
            cast(dict[str, Any], self.scope)[ANSWERED_BY_SERVER] = True

        def _reject(self, status: int, message: str, option: str, limit: float) -> None:
            self._phase = 0
            body = error_bytes(INVALID_REQUEST, message, {"limit": limit, "option": option})
            head = (
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))
            )
            self.transport.write(head + body)
            self.transport.close()

    def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        sweeping.clear()
        now = time.monotonic()
        for connection in list(connections):
            if isinstance(connection, LimitedHttpToolsProtocol):
                connection.overdue(now)
        if connections:
            sweeping.append(loop.call_later(every, _sweep, loop, connections))

    return LimitedHttpToolsProtocol


def allow_open_files(max_connections: int) -> None:
    """Raise the soft open-files limit so that ``max_connections`` connections fit beside what else
    the process holds; log one line when the hard limit does not allow it."""
    wanted = max_connections + FILES_BESIDES_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log.warning(
            "the open-files limit (%d) is below --max-connections %d plus %d: lower --max-connections "
            "or raise the limit (ulimit -n, or nofile in the service's limits)",
            hard,
            max_connections,
            FILES_BESIDES_CONNECTIONS,
        )
