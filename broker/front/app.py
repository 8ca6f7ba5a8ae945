"""The HTTP front: an app factory that mounts a running relay.

Routes: ``/mcp/agent`` (MCP over streamable HTTP, stateless JSON mode, behind agent auth),
``/agent/wait`` (the mail-pending wait, ``broker.front.wait``, behind the same auth),
``/agent/token`` (a per-agent credential exchanged for a token, ``broker.front.token_route``),
``/metrics`` (Prometheus text of the relay's registry), ``/healthz`` (process up), ``/readyz``
(Redis reachable) and, when given one, the operator dashboard at ``/ui``. The relay's lifecycle
stays with the caller: the front owns no storage.

Built as the network listener's front (``NetworkListener``), it serves ``/mcp/agent`` for network
tokens and ``remote`` addresses only, ``/agent/token`` for network credentials, ``/healthz`` and
``/readyz``; ``/metrics`` stays on the loopback
listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.agent_message import AgentMessage
from broker.front.auth import AgentAuthMiddleware
from broker.front.guards import LOOPBACK_NAMES, BodyGuard, HostCheck, RequestCheck
from broker.front.http_limits import DEFAULT_MAX_BODY_BYTES
from broker.front.jsonrpc import INVALID_REQUEST, error_response
from broker.front.paths import LEAVE_PATH, MCP_PATH, TOKEN_PATH, UI_PATH, WAIT_PATH
from broker.front.server import build_mcp_server
from broker.front.token_route import CredentialGate, TokenRoute
from broker.front.tokens import NETWORK_AUDIENCE, KeyRing
from broker.front.tools import DEFAULT_TOOLS, ToolOptions
from broker.front.ui.api import Dashboard
from broker.front.ui.app import create_dashboard
from broker.front.wait import LeaveRoute, WaitRoute
from broker.ports import ICredentials
from broker.relay import Relay
from broker.text import failure
from broker.webhooks import IWebhookTargets

log = logging.getLogger("relay.front")

READY_TIMEOUT = 2.0
METRICS_REFRESH_TIMEOUT = 3.0


@dataclass(frozen=True, slots=True)
class NetworkListener:
    """Build the front of the network listener; ``webhooks`` issues the secrets of webhook
    registrations."""

    webhooks: IWebhookTargets | None = None


def create_app(
    relay: Relay[AgentMessage],
    *,
    keyring: KeyRing | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allowed_hosts: Sequence[str] | None = None,
    before_metrics: Callable[[], Awaitable[None]] | None = None,
    network: NetworkListener | None = None,
    tool_options: ToolOptions = DEFAULT_TOOLS,
    dashboard: Dashboard | None = None,
    credentials: ICredentials | None = None,
) -> FastAPI:
    """Build the front for a running ``relay``.

    Args:
        keyring: verifies agent tokens; without it ``/mcp/agent`` is not served.
        max_body_bytes: larger ``/mcp/agent`` request bodies get 413 (a JSON-RPC error).
        allowed_hosts: host names accepted in ``Host`` (with the port served) and ``Origin`` on
            ``/mcp/agent`` (DNS-rebinding protection); None accepts loopback names only, an empty
            sequence turns the check off (e.g. behind a proxy).
        before_metrics: awaited before each ``/metrics`` render (e.g. refreshing gauges computed from
            Redis), within ``METRICS_REFRESH_TIMEOUT``; a failure is logged and the scrape still served.
        network: serve as the network listener (see the module docstring).
        tool_options: which agent tools are served (``ListAgents``) and what they accept.
        dashboard: served at ``/ui`` when given (only on a loopback listener: the caller decides).
        credentials: the per-agent credentials; with them (and ``keyring``) ``POST /agent/token``
            exchanges one for a short-lived token, and such tokens stop once it is revoked.
    """
    manager = None
    hosts = LOOPBACK_NAMES if allowed_hosts is None else frozenset(allowed_hosts)
    if keyring is not None:
        if network is not None:
            tool_options = replace(tool_options, network=True, webhooks=network.webhooks)
        manager = StreamableHTTPSessionManager(
            app=build_mcp_server(relay, tool_options=tool_options),
            json_response=True,
            stateless=True,
            # Host and Origin are matched exactly by HostCheck (the SDK's patterns match by prefix)
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=max_body_bytes,
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if manager is not None:
                await stack.enter_async_context(manager.run())
            if dashboard is not None:
                await stack.enter_async_context(dashboard.traffic.running())
            yield

    app = _RelayApp(title="relay", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        try:
            ready = await asyncio.wait_for(relay.ready(), READY_TIMEOUT)
        except TimeoutError:
            ready = False
        if ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": "unavailable", "reason": "the message store does not answer"}, status_code=503
        )

    if network is None:
        _add_metrics_route(app, relay, before_metrics)
    if dashboard is not None and network is None:
        app.add_api_route("/ui", lambda: RedirectResponse("/ui/", status_code=307), include_in_schema=False)
        app.mount(UI_PATH, create_dashboard(dashboard))
        app.state.dashboard = dashboard  # `relay serve` swaps its key ring on SIGHUP
    if manager is not None and keyring is not None:
        # First: the agent endpoint carries nearly all requests, and Starlette tries routes in order
        # Authentication before the body is read: a stranger's body is never waited for
        body = BodyGuard(RequestCheck(manager.handle_request), max_bytes=max_body_bytes)
        audience = None if network is None else NETWORK_AUDIENCE
        gate = CredentialGate(credentials) if credentials is not None else None
        auth = AgentAuthMiddleware(body, keyring, audience=audience, credentials=gate)
        app.state.agent_auth = auth  # `relay serve` swaps its key ring on SIGHUP
        endpoint: ASGIApp = HostCheck(auth, hosts) if hosts else auth
        app.router.routes.insert(0, Route(MCP_PATH, endpoint=PostOnly(endpoint)))
        wait: ASGIApp = WaitRoute(relay, auth)
        app.wait_route = HostCheck(wait, hosts) if hosts else wait
        leave: ASGIApp = LeaveRoute(relay, auth)
        app.router.routes.insert(1, Route(LEAVE_PATH, endpoint=HostCheck(leave, hosts) if hosts else leave))
        if credentials is not None:
            token_route = TokenRoute(credentials, keyring, audience=audience)
            app.state.token_route = token_route  # `relay serve` swaps its key ring on SIGHUP
            exchange: ASGIApp = HostCheck(token_route, hosts) if hosts else token_route
            app.router.routes.insert(1, Route(TOKEN_PATH, endpoint=exchange))
    return app


def _add_metrics_route(
    app: FastAPI, relay: Relay[AgentMessage], before_metrics: Callable[[], Awaitable[None]] | None
) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        if before_metrics is not None:
            try:
                await asyncio.wait_for(before_metrics(), METRICS_REFRESH_TIMEOUT)
            except Exception as exc:
                log.warning("metrics refresh failed (%s); serving the last figures", failure(exc))
        return Response(generate_latest(relay.metrics.registry), media_type=CONTENT_TYPE_LATEST)


class _RelayApp(FastAPI):
    """FastAPI, with ``/agent/wait`` answered before the framework's middleware and routing: a parked
    wait is held for minutes, by thousands of agents, and every layer it passes through stays in memory
    meanwhile (the route catches its own errors)."""

    wait_route: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.wait_route is not None and scope.get("path") == WAIT_PATH and scope["type"] == "http":
            await self.wait_route(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class PostOnly:
    """Answer 405 to anything but POST on the MCP endpoint.

    In stateless mode there is no server-to-client stream to GET and no session to DELETE; the SDK would
    otherwise hold a GET open as an event stream that never ends, one task per request. MCP clients
    treat 405 on GET as "no stream offered" (the specification allows it).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "POST":
            await self.app(scope, receive, send)
            return
        refused = error_response(
            405,
            INVALID_REQUEST,
            f"method not allowed: POST JSON-RPC requests to {MCP_PATH}",
            headers={"allow": "POST"},
        )
        await refused(scope, receive, send)
