"""The HTTP front's request guards, each a pure ASGI middleware in front of ``/mcp/agent``.

``HostCheck`` matches ``Host`` and ``Origin`` exactly (name and port), ``BodyGuard`` reads a request
body within a size limit before anything parses it. The limits that need the connection itself (idle
keep-alive, header size and time, body time, concurrent connections) are the HTTP server's
(``relay.http_limits``); their defaults are declared here with the others so that every limit has one
definition.

Every refusal is a JSON-RPC error (``id`` null: the request was not read) whose message names the
limit and the ``relay serve`` option that sets it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("relay.front")

DEFAULT_MAX_BODY_BYTES: Final = 262144
"""Largest ``/mcp/agent`` request body accepted unless configured otherwise."""
DEFAULT_IDLE_TIMEOUT: Final = 5.0
DEFAULT_HEADER_TIMEOUT: Final = 10.0
DEFAULT_MAX_HEADER_BYTES: Final = 64 * 1024
DEFAULT_BODY_TIMEOUT: Final = 10.0
DEFAULT_MAX_CONNECTIONS: Final = 1000

LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "[::1]"})
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
ANSWERED_BY_SERVER: Final = "relay.answered_by_server"
"""Scope key an HTTP server sets (true) when it answered and closed a request itself (a body too slow
or malformed) and logged why: the front then has nothing to add."""


@dataclass(frozen=True)
class HttpLimits:
    """What one connection and one request may take (``relay serve`` options of the same names)."""

    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    """Seconds a connection may sit with no request in progress before it is closed."""
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds from a request's first byte to the end of its headers."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """Bytes of request line and headers."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds from the end of the headers to the end of the body."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once; a further one is answered 503 and closed."""


def error_response(message: str, data: dict[str, object] | None = None) -> bytes:
    """The JSON-RPC error body of a request refused before it was read."""
    error: dict[str, object] = {"code": -32600, "message": message}
    if data:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}, separators=(",", ":")).encode()


async def refuse(send: Send, status: int, message: str, *, close: bool = False, **data: object) -> None:
    body = error_response(message, data or None)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the rest of the request was not read: the connection cannot carry another
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def authority_allowed(value: str, names: Collection[str], port: int | None) -> bool:
    """``value`` is ``NAME`` or ``NAME:PORT`` with NAME one of ``names`` (case-insensitive) and PORT
    exactly ``port`` (``None``: any port from 1 to 65535); no port at all means 80."""
    found = _AUTHORITY.fullmatch(value)
    if found is None or found.group(1).lower() not in names:
        return False
    given = int(found.group(2)) if found.group(2) is not None else 80
    if not 0 < given < 65536 or (found.group(2) is not None and str(given) != found.group(2)):
        return False  # leading zeros or out of range: not the canonical spelling of any port
    return port is None or given == port


class HostCheck:
    """Refuse a request whose ``Host`` or ``Origin`` is not exactly an allowed name and port
    (DNS-rebinding protection): ``Host`` must name the port this server listens on, ``Origin``
    (when present) must be ``http://`` plus an allowed name and a valid port, nothing more."""

    def __init__(self, app: ASGIApp, names: Collection[str] = LOOPBACK_NAMES) -> None:
        self.app = app
        self.names = frozenset(name.lower() for name in names)
        self._hosts: dict[int | None, frozenset[str]] = {}
        """The exact ``Host`` values accepted, by listening port (a set lookup per request)."""

    def _allowed_hosts(self, port: int | None) -> frozenset[str]:
        hosts = self._hosts.get(port)
        if hosts is None:
            if port is None:
                hosts = frozenset()  # no port known: every value goes through the full parse
            else:
                hosts = frozenset(f"{name}:{port}" for name in self.names)
                hosts |= self.names if port == 80 else frozenset()
            self._hosts[port] = hosts
        return hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", ()):
            if name == b"host" and host is None:
                host = bytes(value).decode("latin-1")
            elif name == b"origin" and origin is None:
                origin = bytes(value).decode("latin-1")
        server = scope.get("server")
        port = server[1] if server and isinstance(server[1], int) else None
        if host is None or (
            host not in self._allowed_hosts(port) and not authority_allowed(host, self.names, port)
        ):
            log.info("request refused: Host %r is not this server's loopback name and port", host)
            await refuse(send, 421, f"Host {host!r} is not allowed: use a loopback name and this port")
            return
        if origin is not None and not (
            origin.startswith("http://") and authority_allowed(origin[7:], self.names, None)
        ):
            log.info("request refused: Origin %r is not a loopback origin", origin)
            await refuse(send, 403, f"Origin {origin!r} is not allowed: only loopback origins are")
            return
        await self.app(scope, receive, send)


class BodyGuard:
    """Read the whole request body, at most ``max_bytes``, then hand it on.

    A body over the limit is answered 413 (and the connection closed), and a client that leaves before
    its body is complete is logged in one line: nothing downstream ever sees a half-read body. The
    time a body may take is the HTTP server's limit (it closes the connection, which ends the wait
    here); a server that set ``ANSWERED_BY_SERVER`` in the scope has logged why itself.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                if not scope.get(ANSWERED_BY_SERVER):
                    log.info("request abandoned: the client left before sending its whole body")
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send: Send) -> None:
        await refuse(
            send,
            413,
            f"the request body is over the limit of {self.max_bytes} bytes (relay serve --max-body-bytes)",
            close=True,
            limit=self.max_bytes,
            option="--max-body-bytes",
        )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
