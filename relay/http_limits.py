"""The connection limits of ``relay serve``'s HTTP server: uvicorn's httptools protocol plus the
bounds it lacks.

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` seconds and nothing else: a
fresh connection that never sends, headers that dribble in (httptools accumulates a header of any
size) and an unbounded number of connections are all kept. This protocol closes a fresh connection
after the same idle time, answers 408 to headers not complete within ``header_timeout``, 431 to more
than ``max_header_bytes`` of request line and headers (checked as they arrive, so at most one read
beyond the limit is ever held), and 503 to a connection beyond ``max_connections``, each closing the
connection. The body limits are the front's (``broker.front.limits.BodyGuard``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broker.front.limits import HttpLimits, error_response

log = logging.getLogger("relay.serve")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
FILES_BESIDES_CONNECTIONS = 1024
"""Descriptors ``relay serve`` needs besides its HTTP connections: the Redis pools, the log, ..."""


def protocol_for(limits: HttpLimits) -> type[asyncio.Protocol]:
    """The uvicorn ``http`` protocol class enforcing ``limits``."""

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_headers = False
            self._header_bytes = 0
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                log.warning(
                    "connection refused: %d connections open (--max-connections)", limits.max_connections
                )
                self._reject(
                    503,
                    f"too many connections: at most {limits.max_connections} at once "
                    "(relay serve --max-connections); retry shortly",
                    "--max-connections",
                    limits.max_connections,
                )
                return
            # uvicorn arms its keep-alive timer only after a response: a silent new connection gets it too
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            counting = self._in_headers
            super().data_received(data)
            if self.transport.is_closing() or not (counting or self._in_headers):
                return
            self._header_bytes += len(data)
            if self._in_headers and self._header_bytes > limits.max_header_bytes:
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
            self._in_headers = True
            self._header_bytes = 0
            self._stop_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout, self._headers_too_slow)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._stop_header_timer()
            super().on_headers_complete()

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
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

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _reject(self, status: int, message: str, option: str, limit: float) -> None:
            self._in_headers = False
            self._stop_header_timer()
            body = error_response(message, {"limit": limit, "option": option})
            head = (
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))
            )
            self.transport.write(head + body)
            self.transport.close()

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
