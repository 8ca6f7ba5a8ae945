"""The dashboard as an ASGI app, mounted by the front at ``/ui``.

Pages are one static HTML document and a script (``static/``, no build step, no CDN); the script reads
the JSON API under ``/ui/api`` and polls it for live figures. Every response carries a strict Content
Security Policy (scripts and styles from ``/ui/static`` only, nothing inline, no framing). Requests are
accepted only with a loopback ``Host`` and ``Origin`` (DNS rebinding), with a valid session cookie (see
``access.py``), and state-changing ones only with a same-origin ``Origin`` and the session's CSRF token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.errors import RelayError
from broker.front.guards import LOOPBACK_NAMES, BodyGuard, HostCheck
from broker.front.ui import api, history_api
from broker.front.ui.access import SESSION_TTL, AccessDenied
from broker.front.ui.api import Dashboard

STATIC: Final = Path(__file__).parent / "static"
COOKIE: Final = "relay_ui"
CSRF_HEADER: Final = "x-relay-csrf"
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def _denied(reason: str, status: int = 401) -> Response:
    """The page a stranger gets: how to get in, and why this request was refused (as text)."""
    page = (STATIC / "denied.html").read_text(encoding="utf-8")
    return Response(page.replace("{{reason}}", _escape(reason)), status_code=status, media_type="text/html")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def create_dashboard(dashboard: Dashboard) -> ASGIApp:
    access = dashboard.access

    def session_of(request: Request) -> api.Caller:
        try:
            session = access.session(request.cookies.get(COOKIE))
        except AccessDenied as exc:
            raise api.Refused(401, "unauthenticated", f"{exc}; run `relay dashboard-url`") from None
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if origin != expected:
                raise api.Refused(403, "cross_origin", "state-changing requests must come from this page")
            if not access.check_csrf(session, request.headers.get(CSRF_HEADER)):
                raise api.Refused(403, "csrf", f"missing or wrong {CSRF_HEADER} header; reload the page")
        return api.Caller(session, access.csrf(session))

    async def index(request: Request) -> Response:
        try:
            access.session(request.cookies.get(COOKIE))
        except AccessDenied as exc:
            return _denied(str(exc))
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    async def login(request: Request) -> Response:
        try:
            cookie, _ = await access.login(request.query_params.get("token", ""))
        except AccessDenied as exc:
            return _denied(str(exc))
        except RelayError as exc:  # the store did not answer: nobody is let in
            reason = f"{exc.message}; reload to try again, or run `relay dashboard-url` for a new login URL"
            return _denied(reason, 503)
        # The token leaves the address bar at once (and the history entry), and is spent anyway.
        response = RedirectResponse("/ui/", status_code=303)
        response.set_cookie(COOKIE, cookie, max_age=SESSION_TTL, path="/ui", httponly=True, samesite="strict")
        return response

    async def logout(request: Request) -> Response:
        try:
            session_of(request)
        except api.Refused as exc:
            return exc.response()
        response = JSONResponse({"logged_out": True})
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/login", login, methods=["GET"]),
        Route("/api/logout", logout, methods=["POST"]),
        *api.routes(dashboard, session_of),
        *history_api.routes(dashboard, session_of),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    # Loopback Host and Origin only (a site rebinding its name to 127.0.0.1 gets nothing), bodies
    # read whole up to MAX_BODY_BYTES before any handler runs: the front's own guards.
    guarded = BodyGuard(Guard(Starlette(routes=routes)), max_bytes=api.MAX_BODY_BYTES)
    return HostCheck(guarded, LOOPBACK_NAMES)


class Guard:
    """The security headers on every response of the dashboard."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_secured)
