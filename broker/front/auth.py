"""Agent authentication for ``/mcp/agent``: the ASGI middleware that checks every request.

The token format and key ring are in ``broker.front.tokens``, key files in ``broker.front.key_file``.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from mcp.types import INTERNAL_ERROR

from broker.errors import RelayError, error_body
from broker.front.jsonrpc import UNAUTHORIZED, error_response
from broker.front.tokens import VERIFIED_CACHE_SIZE, AgentIdentity, AuthError, KeyRing, bearer_token

if TYPE_CHECKING:
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from broker.front.token_route import CredentialGate

log = logging.getLogger("relay.auth")


class AgentAuthMiddleware:
    """Pure ASGI middleware in front of the MCP endpoint (not ``BaseHTTPMiddleware``: responses stream).

    A verified request gets ``scope["state"]["agent"] = AgentIdentity`` and ``scope["user"]`` (which the
    MCP SDK uses to bind sessions to their caller); any other gets 401 with a JSON-RPC error body.
    """

    def __init__(
        self,
        app: ASGIApp,
        keyring: KeyRing,
        *,
        audience: str | None = None,
        credentials: CredentialGate | None = None,
    ) -> None:
        self.app = app
        self.keyring = keyring
        """Replaced as a whole by ``use`` (a key ring is immutable): each request reads it once."""
        self.audience = audience
        """The listener's audience: only tokens minted for it pass (``broker.front.tokens``)."""
        self.credentials = credentials
        """Checks tokens exchanged for a credential (``broker.front.token_route``); without it such
        tokens are refused, since nothing could tell that their credential was revoked."""

    def use(self, keyring: KeyRing) -> None:
        """Verify with ``keyring`` from the next request on (a reloaded key file): tokens of keys it
        no longer lists are refused at once, since the verified-token cache lives in the old ring."""
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if await self.authenticate(scope, send) is not None:
            await self.app(scope, receive, send)

    async def authenticate(self, scope: Scope, send: Send) -> AgentIdentity | None:
        """The verified caller of an HTTP request, recorded in ``scope``; or None once the 401 is sent.
        (Also the check of the agent routes that are not MCP, e.g. ``/agent/wait``.)"""
        wanted = {b"authorization": "", b"x-csf-agent-id": "", b"x-csf-session-id": ""}
        found: set[bytes] = set()
        for name, value in scope.get("headers", ()):
            lowered = bytes(name).lower()
            if lowered in wanted and lowered not in found:
                found.add(lowered)
                wanted[lowered] = bytes(value).decode("latin-1").strip()
        try:
            token = bearer_token(wanted[b"authorization"])
            identity = self.keyring.verify(
                token, wanted[b"x-csf-agent-id"], wanted[b"x-csf-session-id"], audience=self.audience
            )
            if identity.credential is not None:
                if self.credentials is None:
                    raise AuthError("unknown_credential")
                await self.credentials.check(identity)
        except RelayError as exc:
            if not isinstance(exc, AuthError):  # the store cannot tell whether the credential stands
                await _unavailable(exc)(scope, _no_body, send)
                return None
            client = scope.get("client")
            log.info(
                "agent authentication refused",
                extra={
                    "cause": exc.cause,
                    "client": client[0] if client else None,
                    "path": scope.get("path"),
                },
            )
            await _refusal(exc)(scope, _no_body, send)
            return None
        scope.setdefault("state", {})["agent"] = identity
        scope["user"] = _authenticated_user(identity)
        return identity


# An agent repeats the same identity on every call; identities are immutable (expiry included, and
# the key ring checks it before this is reached), so one user serves each.
@functools.lru_cache(maxsize=VERIFIED_CACHE_SIZE)
def _authenticated_user(identity: AgentIdentity) -> AuthenticatedUser:
    """What the MCP SDK binds stateful sessions to. (Imported here: the CLI need not load the SDK.)"""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(
        AccessToken(
            token="<redacted>",  # noqa: S106 - the real token is never kept
            client_id=f"{identity.agent}/{identity.session}",
            scopes=[],
            expires_at=identity.expires_at,
        )
    )


def _refusal(error: AuthError) -> Response:
    challenge = f'Bearer realm="relay", error="invalid_token", error_description="{error.cause}"'
    return error_response(
        401,
        UNAUTHORIZED,
        f"unauthorized: {error.cause}: {error.message}",
        data={"cause": error.cause},
        headers={"www-authenticate": challenge, "cache-control": "no-store"},
    )


def _unavailable(error: RelayError) -> Response:
    return error_response(
        503, INTERNAL_ERROR, f"{error.code}: {error.message}", data=error_body(error)["error"]
    )


async def _no_body() -> Message:
    # authenticate() runs before anything reads the request; a response never reads it either
    return {"type": "http.disconnect"}
