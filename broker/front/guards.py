"""The HTTP front's request guards, each a pure ASGI middleware in front of ``/mcp/agent``.

``HostCheck`` matches ``Host`` and ``Origin`` exactly (name and port), ``BodyGuard`` reads a request
body within a size limit before anything parses it, ``RequestCheck`` refuses what is not one JSON-RPC
request as the specification says (the MCP SDK would not). The limits that need the connection itself (idle
keep-alive, header size and time, body time, concurrent connections) are the HTTP server's
(``relay.http_limits``); every limit's default is declared once, in ``broker.front.http_limits``.

Every refusal is a JSON-RPC error (``broker.front.jsonrpc``): a limit's names the limit and the
``relay serve`` option that sets it (``id`` null: the request was not read).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from typing import Final

import pydantic_core
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import SUPPORTED_PROTOCOL_VERSIONS
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.errors import json_type
from broker.front.http_limits import ANSWERED_BY_SERVER
from broker.front.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    RequestId,
    error_response,
)
from broker.text import encodable, shown

log = logging.getLogger("relay.front")

LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "[::1]"})
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


def refusal(status: int, message: str, *, close: bool = False, **data: object) -> Response:
    """The answer to a request refused before it was read: an Invalid Request, ``id`` null."""
    # close: the rest of the request was not read, so the connection cannot carry another
    headers = {"connection": "close"} if close else None
    return error_response(status, INVALID_REQUEST, message, data=data or None, headers=headers)


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
            await refusal(421, f"Host {host!r} is not allowed: use a loopback name and this port")(
                scope, receive, send
            )
            return
        if origin is not None and not (
            origin.startswith("http://") and authority_allowed(origin[7:], self.names, None)
        ):
            log.info("request refused: Origin %r is not a loopback origin", origin)
            await refusal(403, f"Origin {origin!r} is not allowed: only loopback origins are")(
                scope, receive, send
            )
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
            await self._too_large()(scope, receive, send)
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
                await self._too_large()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    def _too_large(self) -> Response:
        return refusal(
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


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` (read already, whole) handed over first, as one message."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


JSON_TYPE: Final = "application/json"
_VERSION_HEADER: Final = MCP_PROTOCOL_VERSION_HEADER.encode("ascii")


class Refusal(Exception):
    def __init__(
        self, status: int, code: int, message: str, request_id: RequestId | None = None, data: object = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.request_id, self.data = (
            status,
            code,
            message,
            request_id,
            data,
        )


class RequestCheck:
    """Answer like the JSON-RPC specification where the MCP SDK would not, before it reads a request.

    Behind ``BodyGuard`` (the whole body is read), in front of the SDK. Refused, naming the rule and
    with the request's ``id`` whenever the body has a readable one:

    - a ``Content-Type`` other than ``application/json``: 415;
    - a body that is not JSON: -32700 (Parse error);
    - an Invalid Request (-32600): a batch, anything but an object, ``jsonrpc`` other than ``"2.0"``, no
      ``method`` or one that is not a string, an ``id`` that is neither a string nor an integer (the
      SDK takes such a request for a notification and never answers it), a posted response (this
      endpoint sends no requests to answer);
    - ``params`` that is not an object: -32602 (Invalid params);
    - an ``MCP-Protocol-Version`` header naming a revision the SDK does not serve: -32022 with the
      supported revisions (the SDK's own code and data for it), in a message naming the header.

    Everything else goes to the SDK, which reads the very body checked here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        message = await receive()  # the body guard (in front) hands the whole body over in one message
        try:
            check(scope, message.get("body", b""))
        except Refusal as refused:
            response = error_response(
                refused.status,
                refused.code,
                refused.message,
                request_id=refused.request_id,
                data=refused.data,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, replay(message.get("body", b""), receive), send)


def check(scope: Scope, body: bytes) -> None:
    """Raise ``Refusal`` for a request the SDK would answer unlike the specification."""
    content_type = version = None
    for name, value in scope.get("headers", ()):
        if name == b"content-type" and content_type is None:
            content_type = bytes(value).decode("latin-1")
        elif name == _VERSION_HEADER and version is None:
            version = bytes(value).decode("latin-1")
    if content_type is None or content_type.partition(";")[0].strip().lower() != JSON_TYPE:
        got = "none" if content_type is None else repr(shown(content_type))
        raise Refusal(415, INVALID_REQUEST, f"Content-Type must be {JSON_TYPE} (got {got})")
    try:
        data = pydantic_core.from_json(body)
    except ValueError as exc:
        raise Refusal(
            400, PARSE_ERROR, f"Parse error: the body is not JSON ({shown(str(exc), 120)})"
        ) from None
    request_id = check_envelope(data)
    if version is not None and version not in SUPPORTED_PROTOCOL_VERSIONS:
        supported = ", ".join(SUPPORTED_PROTOCOL_VERSIONS)
        raise Refusal(
            400,
            UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported MCP-Protocol-Version header {shown(version)!r}: this server supports "
            f"{supported}; send one of them (or none, for 2025-03-26)",
            request_id,
            {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": shown(version)},
        )


def check_envelope(data: object) -> RequestId | None:
    """The id of a JSON-RPC request (None for a notification); ``Refusal`` when ``data`` is neither."""
    if isinstance(data, list):
        raise Refusal(
            400, INVALID_REQUEST, "batches are not accepted: send one JSON-RPC request per POST, as an object"
        )
    if not isinstance(data, dict):
        raise Refusal(
            400, INVALID_REQUEST, f"the body must be a JSON-RPC request object, not {json_type(data)}"
        )
    request_id: RequestId | None = None
    if "id" in data:
        raw = data["id"]
        if (isinstance(raw, int) and not isinstance(raw, bool)) or (isinstance(raw, str) and encodable(raw)):
            request_id = raw
        elif isinstance(raw, str):
            raise Refusal(400, INVALID_REQUEST, "id must be valid Unicode (it holds a lone surrogate)")
        else:
            raise Refusal(400, INVALID_REQUEST, f"id must be a string or an integer, not {json_type(raw)}")
    if data.get("jsonrpc") != "2.0":
        raise Refusal(400, INVALID_REQUEST, 'jsonrpc must be "2.0"', request_id)
    if "method" not in data:
        if "result" in data or "error" in data:
            raise Refusal(
                400,
                INVALID_REQUEST,
                "a response is not accepted here: this server sends no requests",
                request_id,
            )
        raise Refusal(
            400,
            INVALID_REQUEST,
            "method is required: a request names its method, e.g. tools/list",
            request_id,
        )
    if not isinstance(data["method"], str):
        raise Refusal(
            400, INVALID_REQUEST, f"method must be a string, not {json_type(data['method'])}", request_id
        )
    params = data.get("params")
    if params is not None and not isinstance(params, dict):
        raise Refusal(400, INVALID_PARAMS, f"params must be an object, not {json_type(params)}", request_id)
    return request_id
