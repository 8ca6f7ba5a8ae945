"""``POST /agent/token``: a per-agent credential exchanged for the short-lived token ``/mcp/agent`` checks.

Request: ``Authorization: Bearer <id>.<secret>`` (a credential of ``relay credentials issue``) and the
body ``{"agent": ID, "session": SID}`` (optionally ``"ttl_seconds"``, for a shorter lifetime). Answer
(200): ``{"token", "expires_at", "expires_in", "headers"}``, the token signed with the relay's key,
bound to the agent, the session, this listener's audience and the credential's id, valid
``EXCHANGE_TTL_SECONDS`` (never past the credential's expiry), and ``headers`` the three an agent sends.
Refusals: 400 for a bad body, 401 with ``cause`` ``unknown_credential`` (no such id, or a wrong secret:
the two are not told apart), ``revoked``, ``expired``, ``wrong_audience`` (a loopback credential on the
network listener, or the reverse) or ``wrong_agent``; 429 ``too_many_failures`` after ``MAX_FAILURES``
wrong credentials from one client for one id within ``FAILURE_WINDOW_SECONDS`` (nothing is looked up
meanwhile); 503 when the store does not answer. Every exchange and refusal is one audit log line
(``relay.credentials``) and a count of ``csf_relay_credentials_total{event}``.

A token names its credential, and ``CredentialGate`` refuses it (401 ``revoked``) once the credential is
revoked: each process asks the store again when its answer is ``REVOCATION_CHECK_SECONDS`` old, so a
revocation stops every token minted from the credential within that time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Final

from starlette.responses import JSONResponse

from broker.credentials import Credential, CredentialEvent, split
from broker.envelope import format_ms
from broker.errors import InvalidArgument, RelayError, TooManyFailures, error_body, json_type
from broker.front.errors import http_status
from broker.front.tokens import (
    AGENT_HEADER,
    NETWORK_AUDIENCE,
    SESSION_HEADER,
    AgentIdentity,
    AuthCause,
    AuthError,
    KeyRing,
    bearer_token,
)
from broker.ids import check_agent_id, check_session_id
from broker.ports import ICredentials
from broker.text import shown

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

audit = logging.getLogger("relay.credentials")

EXCHANGE_TTL_SECONDS: Final = 900
"""Lifetime of an exchanged token: Claude Code runs its headersHelper again after a 401."""
REVOCATION_CHECK_SECONDS: Final = 5.0
"""How old a process's answer to "is this credential revoked?" may be before it asks the store again."""
MAX_FAILURES: Final = 10
FAILURE_WINDOW_SECONDS: Final = 60.0
MAX_BODY_BYTES: Final = 1024
MAX_TRACKED: Final = 4096
"""Clients (and credentials) the failure limit and the revocation cache remember, oldest dropped."""
_EXAMPLE: Final = '{"agent": "author", "session": "claude-4242-118733"}'


def listener_name(audience: str | None) -> str:
    """The credential audience a listener serves: ``network`` for network tokens, else ``loopback``."""
    return "network" if audience == NETWORK_AUDIENCE else "loopback"


class FailureLimit:
    """Wrong credentials per key (client address and credential id), in a sliding window. Keyed by the
    id too, so that one local process sending wrong secrets does not lock out every other agent on the
    same address; a secret of 32 random bytes is not guessed at any rate, the limit bounds the noise."""

    def __init__(self, limit: int = MAX_FAILURES, window: float = FAILURE_WINDOW_SECONDS) -> None:
        self.limit = limit
        self.window = window
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def retry_after(self, key: tuple[str, str], now: float) -> float:
        """Seconds until ``key`` may try again; 0 when it may now."""
        failures = self._failures.get(key)
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures or len(failures) < self.limit:
            return 0.0
        return failures[0] + self.window - now

    def attempt(self, key: tuple[str, str], now: float) -> None:
        """Count an attempt as a failure before it is checked (so that concurrent attempts cannot all
        pass ``retry_after`` at once); ``forgive`` takes it back when it succeeds. So more than
        ``limit`` exchanges of one credential from one client at the same instant are refused too: one
        agent folder's helper and waiter make one or two."""
        failures = self._failures.setdefault(key, deque(maxlen=self.limit))
        failures.append(now)
        self._failures.move_to_end(key)
        while len(self._failures) > MAX_TRACKED:
            self._failures.popitem(last=False)

    def forgive(self, key: tuple[str, str], now: float) -> None:
        failures = self._failures.get(key)
        if failures is not None and now in failures:
            failures.remove(now)


class CredentialGate:
    """Refuses tokens whose credential was revoked, asking the store at most once per credential per
    ``REVOCATION_CHECK_SECONDS`` in this process (see the module docstring)."""

    def __init__(self, store: ICredentials, max_age: float = REVOCATION_CHECK_SECONDS) -> None:
        self.store = store
        self.max_age = max_age
        self._known: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    async def check(self, identity: AgentIdentity) -> None:
        """Raise ``AuthError("revoked")`` for a token of a revoked (or vanished) credential;
        ``BackendUnavailable`` when the store cannot tell and this process has no answer yet."""
        credential = identity.credential
        if credential is None:
            return
        now = time.monotonic()
        known = self._known.get(credential)
        if known is None or now - known[0] >= self.max_age:
            try:
                record = await self.store.get(credential)
                ok = record is not None and not record.revoked
            except RelayError:
                if known is None:
                    raise
                ok = known[1]  # a store outage keeps the last answer until the store answers again
            known = (now, ok)
            self._known[credential] = known
            self._known.move_to_end(credential)
            while len(self._known) > MAX_TRACKED:
                self._known.popitem(last=False)
        if not known[1]:
            raise AuthError("revoked")


class TokenRoute:
    """The ASGI app of ``POST /agent/token`` on one listener (see the module docstring)."""

    def __init__(self, store: ICredentials, keyring: KeyRing, *, audience: str | None = None) -> None:
        self.store = store
        self.keyring = keyring
        """Swapped by ``relay serve`` on SIGHUP (``use``), like the agent endpoint's."""
        self.audience = audience
        self.listener = listener_name(audience)
        self.failures = FailureLimit()

    def use(self, keyring: KeyRing) -> None:
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope.get("method") != "POST":
            refused = InvalidArgument("method", "method.post", "POST the exchange")
            await _answer(scope, receive, send, 405, error_body(refused), {"allow": "POST"})
            return
        status, body = await self.exchange(scope, receive)
        await _answer(scope, receive, send, status, body)

    async def exchange(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, object]]:
        client = scope.get("client")
        host = str(client[0]) if client else "-"
        authorization = ""
        for name, value in scope.get("headers", ()):
            if bytes(name).lower() == b"authorization":
                authorization = bytes(value).decode("latin-1").strip()
                break
        try:
            agent, session, ttl = parse_body(await _body(receive))
        except _TooLarge:
            refused = InvalidArgument("body", "body.max_bytes", f"at most {MAX_BODY_BYTES} bytes")
            return 413, error_body(refused)
        except InvalidArgument as exc:
            return 400, error_body(exc)
        try:
            text = bearer_token(authorization)
            if not text:
                raise AuthError("missing_authorization", "send `Authorization: Bearer <credential>`")
        except AuthError as exc:
            return await self._refused(exc, agent, None, host)
        parts = split(text)
        ident = parts[0] if parts is not None else "-"
        now = time.monotonic()
        wait = self.failures.retry_after((host, ident), now)
        if wait > 0:
            limited = TooManyFailures(wait, self.failures.limit, self.failures.window)
            self._log("refused", agent, parts[0] if parts else None, host, cause=limited.code)
            return http_status(limited), error_body(limited)
        self.failures.attempt((host, ident), now)
        try:
            record = await self.store.get(parts[0]) if parts is not None else None
            if record is None or parts is None or not record.matches(parts[1]):
                raise AuthError("unknown_credential")
            self.failures.forgive((host, ident), now)
            now_ms = int(time.time() * 1000)
            self._check(record, agent, now_ms)
            if record.expires_at_ms is not None:
                ttl = max(1, min(ttl, (record.expires_at_ms - now_ms) // 1000))
            token = self.keyring.mint(
                agent, session, ttl, now=now_ms / 1000, audience=self.audience, credential=record.id
            )
            await self.store.used(record.id, now_ms)
        except AuthError as exc:
            return await self._refused(exc, agent, parts[0] if parts else None, host)
        except RelayError as exc:  # the store does not answer: nothing was minted, nothing counted
            self.failures.forgive((host, ident), now)
            return http_status(exc), error_body(exc)
        self._log("exchanged", agent, record.id, host, session=session)
        headers = {"Authorization": f"Bearer {token}", AGENT_HEADER: agent, SESSION_HEADER: session}
        expires_ms = (now_ms // 1000 + ttl) * 1000
        return 200, {
            "token": token,
            "expires_at": format_ms(expires_ms),
            "expires_in": ttl,
            "headers": headers,
        }

    def _check(self, record: Credential, agent: str, now_ms: int) -> None:
        cause: AuthCause | None = None
        message = None
        if record.revoked:
            cause = "revoked"
        elif record.expired(now_ms):
            assert record.expires_at_ms is not None
            cause = "expired"
            message = (
                f"the credential expired at {format_ms(record.expires_at_ms)}; issue a new one with "
                "`relay credentials issue` (or re-run `relay setup claude-code`)"
            )
        elif record.audience != self.listener:
            cause = "wrong_audience"
            message = (
                f"the credential is for the {record.audience} listener, this is the {self.listener} one; "
                f"issue one {'with' if self.listener == 'network' else 'without'} --network"
            )
        elif record.agent != agent:
            cause = "wrong_agent"
            message = f"the credential acts as agent {record.agent!r}, not {agent!r}"
        if cause is not None:
            raise AuthError(cause, message)

    async def _refused(
        self, error: AuthError, agent: str, credential: str | None, host: str
    ) -> tuple[int, dict[str, object]]:
        self._log("refused", agent, credential, host, cause=error.cause)
        with contextlib.suppress(RelayError):  # the refusal stands; only its count is lost (it is logged)
            await self.store.count("refused")
        return 401, error_body(error)

    def _log(
        self, event: CredentialEvent, agent: str, credential: str | None, host: str, **extra: str
    ) -> None:
        audit.info(
            "credential %s",
            event,
            extra={
                "event": event,
                "agent": agent,
                "credential": credential,
                "listener": self.listener,
                "client": host,
                **extra,
            },
        )


def parse_body(raw: bytes) -> tuple[str, str, int]:
    """``(agent, session, ttl_seconds)`` of an exchange's body (``ttl_seconds``, optional, asks for a
    shorter lifetime than ``EXCHANGE_TTL_SECONDS``); ``InvalidArgument`` naming the field otherwise."""
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidArgument("body", "body.json", f"the body must be JSON such as {_EXAMPLE}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(
            "body", "body.type", f"must be a JSON object such as {_EXAMPLE}, got {json_type(data)}"
        )
    for name in data:
        if name not in ("agent", "session", "ttl_seconds"):
            field = shown(name)
            raise InvalidArgument(
                field,
                "body.unknown_field",
                f"unknown field {field!r}: the body has agent, session and optionally ttl_seconds",
            )
    for name in ("agent", "session"):
        if not isinstance(data.get(name), str):
            raise InvalidArgument(name, f"{name}.required", f"is required (a string), e.g. {_EXAMPLE}")
    ttl = data.get("ttl_seconds", EXCHANGE_TTL_SECONDS)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= EXCHANGE_TTL_SECONDS:
        raise InvalidArgument(
            "ttl_seconds", "ttl_seconds.range", f"must be a whole number from 1 to {EXCHANGE_TTL_SECONDS}"
        )
    return check_agent_id(data["agent"], "agent"), check_session_id(data["session"], "session"), ttl


class _TooLarge(Exception):
    pass


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> None:
    extra = {"cache-control": "no-store", **(headers or {})}
    error = body.get("error")
    if status == 401 and isinstance(error, dict):
        cause = error.get("cause", "")
        extra["www-authenticate"] = (
            f'Bearer realm="relay", error="invalid_token", error_description="{cause}"'
        )
    if status == 429 and isinstance(error, dict) and isinstance(error.get("retry_after"), float | int):
        extra["retry-after"] = str(max(1, int(error["retry_after"] + 0.999)))
    await JSONResponse(body, status_code=status, headers=extra)(scope, receive, send)
