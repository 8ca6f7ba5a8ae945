"""The limits of one HTTP connection and request at the front: their defaults (the ``relay serve``
options of the same names) and ``HttpLimits``. ``broker.front.guards.BodyGuard`` applies the body
size; the HTTP server applies the rest (``relay.http_limits``), since they need the connection
itself. Nothing here imports the MCP SDK: ``relay``'s settings read these defaults in every command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_MAX_BODY_BYTES: Final = 262144
"""Largest ``/mcp/agent`` request body accepted unless configured otherwise."""
DEFAULT_IDLE_TIMEOUT: Final = 30.0
"""Longer than the keep-alive expiry of common clients (httpx 5 s, Node's fetch 4 s, aiohttp 15 s): a
client then drops an idle connection before relay closes it, and never sends a request on a connection
the server is closing (which fails as a read error, and a send may or may not have landed). A new
connection that sends nothing is closed after the header timeout when that is shorter."""
DEFAULT_HEADER_TIMEOUT: Final = 10.0
DEFAULT_MAX_HEADER_BYTES: Final = 64 * 1024
DEFAULT_BODY_TIMEOUT: Final = 10.0
DEFAULT_MAX_CONNECTIONS: Final = 1000
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
