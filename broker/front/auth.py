"""Agent authentication for ``/mcp/agent``: signing keys, v1 tokens and the ASGI middleware.

Every request carries three headers minted by the host that holds the signing key
(``relay agent-headers``)::

    Authorization: Bearer v1.<payload>.<sig>
    X-CSF-Agent-ID: <agent>
    X-CSF-Session-ID: <session>

``payload`` is base64url (no padding) of compact, key-sorted JSON
``{"agent", "session", "iat", "exp", "kid"}``; ``sig`` is base64url of HMAC-SHA256 over the ASCII bytes
``"v1." + payload`` with the key whose id (first 8 hex characters of its SHA-256) is ``kid``.

Key files hold one key per line (base64url of 32 random bytes); ``#`` comments and blank lines are
ignored. The first key signs, every key verifies. To rotate: put a new key on the first line, keep
the old one until the tokens it signed have expired, then delete it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from broker.errors import InvalidArgument, RelayError
from broker.ids import check_agent_id, check_session_id

if TYPE_CHECKING:
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("relay.auth")

TOKEN_VERSION: Final = "v1"  # noqa: S105 - a format tag, not a secret
KEY_BYTES: Final = 32
MAX_TOKEN_CHARS: Final = 4096
MAX_TTL_SECONDS: Final = 31_536_000
DEFAULT_TTL_SECONDS: Final = 86_400
CLOCK_SKEW_SECONDS: Final = 60
VERIFIED_CACHE_SIZE: Final = 1024
"""Verified (token, agent, session) tuples a key ring remembers; the oldest goes first."""
MAX_CACHED_TOKEN_CHARS: Final = 1024
"""Longer tokens verify every time (a relay-minted token is about 200 characters)."""
MAX_KEY_FILE_BYTES: Final = 64 * 1024

AGENT_HEADER: Final = "X-CSF-Agent-ID"
SESSION_HEADER: Final = "X-CSF-Session-ID"

AuthCause = Literal[
    "missing_authorization",
    "missing_agent_header",
    "missing_session_header",
    "malformed_token",
    "unsupported_token_version",
    "unknown_key",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "agent_mismatch",
    "session_mismatch",
]

_REMINT = "mint new headers with `relay agent-headers`"
AUTH_MESSAGES: Final[dict[AuthCause, str]] = {
    "missing_authorization": f"send `Authorization: Bearer v1.…`; {_REMINT}",
    "missing_agent_header": f"send the {AGENT_HEADER} header the token was minted for",
    "missing_session_header": f"send the {SESSION_HEADER} header the token was minted for",
    "malformed_token": f"the bearer token is not a relay v1 token; {_REMINT}",
    "unsupported_token_version": f"only v1 tokens are accepted; {_REMINT}",
    "unknown_key": f"the token was signed by a key this relay does not hold (rotated out?); {_REMINT}",
    "bad_signature": f"the token's signature does not verify; {_REMINT}",
    "expired": f"the token has expired; {_REMINT}",
    "not_yet_valid": "the token was issued in the future; check the clocks of the minting host and the relay",
    "agent_mismatch": f"{AGENT_HEADER} differs from the agent the token was minted for; "
    "send the headers as minted",
    "session_mismatch": f"{SESSION_HEADER} differs from the session the token was minted for; "
    "send the headers as minted",
}

_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_KEY_LINE = re.compile(r"[A-Za-z0-9_-]{43}")
_KID = re.compile(r"[0-9a-f]{8}")
_VERSION = re.compile(r"v[0-9]+")
_CLAIMS: Final = frozenset({"agent", "session", "iat", "exp", "kid"})


class KeyFileError(ValueError):
    """A key file that cannot be used; the one-line message says what is wrong and what to do."""


class AuthError(RelayError):
    """A request that does not authenticate. ``cause`` is one of the stable ``AuthCause`` strings."""

    code = "unauthorized"

    def __init__(self, cause: AuthCause, message: str | None = None) -> None:
        super().__init__(message if message is not None else AUTH_MESSAGES[cause])
        self.cause: AuthCause = cause

    def details(self) -> dict[str, object]:
        return {"cause": self.cause}


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who a verified request comes from; ``expires_at`` is the token's expiry (Unix seconds)."""

    agent: str
    session: str
    expires_at: int


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes | None:
    """Strict base64url without padding; None unless ``text`` is the canonical encoding of something."""
    if _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        return None
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return data if _b64encode(data) == text else None


def key_id(key: bytes) -> str:
    """The id a token names its signing key by: the first 8 hex characters of SHA-256(key)."""
    return hashlib.sha256(key).hexdigest()[:8]


def generate_key() -> str:
    """A new signing key: base64url (no padding) of 32 random bytes."""
    return _b64encode(secrets.token_bytes(KEY_BYTES))


class KeyRing:
    """Signing keys: the first signs, every one verifies."""

    __slots__ = ("_keys", "_signing", "_verified")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        by_id: dict[str, bytes] = {}
        for key in keys:
            if len(key) != KEY_BYTES:
                raise ValueError(f"a signing key is {KEY_BYTES} bytes, not {len(key)}")
            kid = key_id(key)
            if kid in by_id:
                raise ValueError(f"key {kid} is listed twice")
            by_id[kid] = bytes(key)
        self._keys = by_id
        self._signing = key_id(keys[0])
        # (token, agent header, session header) -> (identity, iat) of tuples that verified: an agent
        # sends the same three headers on every call. Only successes are kept, the time checks run
        # again on every hit, and the oldest entry goes when it is full (see verify).
        self._verified: dict[tuple[str, str, str], tuple[AgentIdentity, int]] = {}

    @property
    def signing_kid(self) -> str:
        return self._signing

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(signing={self._signing!r}, kids={self.kids!r})"

    def mint(
        self, agent: str, session: str, ttl_seconds: int = DEFAULT_TTL_SECONDS, now: float | None = None
    ) -> str:
        """A v1 token for ``agent`` in ``session``, valid for ``ttl_seconds`` (1 s to 1 year)."""
        check_agent_id(agent, "agent")
        check_session_id(session, "session")
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int)
            or not 1 <= ttl_seconds <= MAX_TTL_SECONDS
        ):
            raise InvalidArgument(
                "ttl_seconds", "ttl.range", f"must be a whole number of seconds from 1 to {MAX_TTL_SECONDS}"
            )
        iat = int(time.time() if now is None else now)
        claims = {
            "agent": agent,
            "session": session,
            "iat": iat,
            "exp": iat + ttl_seconds,
            "kid": self._signing,
        }
        payload = _b64encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("ascii"))
        return f"{TOKEN_VERSION}.{payload}.{self._sign(self._keys[self._signing], payload)}"

    @staticmethod
    def _sign(key: bytes, payload: str) -> str:
        signed = f"{TOKEN_VERSION}.{payload}".encode("ascii")
        return _b64encode(hmac.new(key, signed, hashlib.sha256).digest())

    def verify(
        self,
        token: str | None,
        agent_header: str | None,
        session_header: str | None,
        now: float | None = None,
    ) -> AgentIdentity:
        """The identity ``token`` proves for these headers, or ``AuthError`` naming the first failure."""
        if type(token) is str and type(agent_header) is str and type(session_header) is str:
            hit = self._verified.get((token, agent_header, session_header))
            if hit is not None:  # signature, claims and headers verified before: only the time again
                identity, issued = hit
                current = int(time.time() if now is None else now)
                if current >= identity.expires_at:
                    self._verified.pop((token, agent_header, session_header), None)
                    raise AuthError("expired")
                if issued > current + CLOCK_SKEW_SECONDS:
                    raise AuthError("not_yet_valid")
                return identity
        if not token:
            raise AuthError("missing_authorization")
        if not agent_header:
            raise AuthError("missing_agent_header")
        if not session_header:
            raise AuthError("missing_session_header")
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise AuthError("malformed_token")
        parts = token.split(".")
        if parts[0] != TOKEN_VERSION and _VERSION.fullmatch(parts[0]) is not None:
            raise AuthError("unsupported_token_version")
        if len(parts) != 3 or parts[0] != TOKEN_VERSION:
            raise AuthError("malformed_token")
        _, payload, sig_text = parts
        raw = _b64decode(payload)
        sig = _b64decode(sig_text)
        if raw is None or sig is None or len(sig) != hashlib.sha256().digest_size:
            raise AuthError("malformed_token")
        try:
            claims = json.loads(raw)
        except (ValueError, RecursionError):
            raise AuthError("malformed_token") from None
        if not isinstance(claims, dict):
            raise AuthError("malformed_token")
        # Only the key id is read before the signature is checked; nothing else is trusted until then.
        kid = claims.get("kid")
        if not isinstance(kid, str) or _KID.fullmatch(kid) is None:
            raise AuthError("malformed_token")
        key = self._keys.get(kid)
        if key is None:
            raise AuthError("unknown_key")
        if not hmac.compare_digest(self._sign(key, payload), sig_text):
            raise AuthError("bad_signature")
        agent, session, iat, exp = _check_claims(claims)
        current = int(time.time() if now is None else now)
        if current >= exp:
            raise AuthError("expired")
        if iat > current + CLOCK_SKEW_SECONDS:
            raise AuthError("not_yet_valid")
        if agent_header != agent:
            raise AuthError("agent_mismatch")
        if session_header != session:
            raise AuthError("session_mismatch")
        identity = AgentIdentity(agent, session, exp)
        if len(token) <= MAX_CACHED_TOKEN_CHARS:
            if len(self._verified) >= VERIFIED_CACHE_SIZE:
                self._verified.pop(next(iter(self._verified)), None)
            self._verified[token, agent, session] = (identity, iat)
        return identity


def _check_claims(claims: dict[str, object]) -> tuple[str, str, int, int]:
    """Strict shape of signed claims (a signed token from a buggy minter is still refused)."""
    if set(claims) != _CLAIMS:
        raise AuthError("malformed_token")
    agent, session, iat, exp = claims["agent"], claims["session"], claims["iat"], claims["exp"]
    if not isinstance(iat, int) or isinstance(iat, bool) or not isinstance(exp, int) or isinstance(exp, bool):
        raise AuthError("malformed_token")
    if iat < 0 or exp <= iat:
        raise AuthError("malformed_token")
    try:
        return check_agent_id(agent), check_session_id(session), iat, exp
    except InvalidArgument:
        raise AuthError("malformed_token") from None


def agent_headers(
    keyring: KeyRing, agent: str, session: str, ttl: int = DEFAULT_TTL_SECONDS, now: float | None = None
) -> dict[str, str]:
    """The three headers an agent sends on every ``/mcp/agent`` request."""
    token = keyring.mint(agent, session, ttl, now=now)
    return {"Authorization": f"Bearer {token}", AGENT_HEADER: agent, SESSION_HEADER: session}


# --- key files -------------------------------------------------------------------------------------


def load_key_file(path: str | os.PathLike[str]) -> KeyRing:
    """Read a key file, refusing anything unsafe or malformed with a ``KeyFileError``."""
    where = Path(path)
    keygen = f"create one with `relay keygen {where}`"
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise KeyFileError(f"key file {where} does not exist; {keygen}") from None
    except PermissionError:
        raise KeyFileError(f"key file {where} cannot be read (permission denied); check its owner") from None
    except OSError as exc:
        raise KeyFileError(f"key file {where} cannot be opened ({exc.strerror}); {keygen}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"key file {where} is not a regular file; {keygen}")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"key file {where} is readable or writable by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {where}`"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"key file {where} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {where} is larger than {MAX_KEY_FILE_BYTES} bytes; is it a key file?")
    if not data.strip():
        raise KeyFileError(f"key file {where} is empty; {keygen} --force")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {where} is not ASCII text; {keygen} --force") from None
    keys: list[bytes] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        key = _b64decode(entry) if _KEY_LINE.fullmatch(entry) else None
        if key is None or len(key) != KEY_BYTES:
            raise KeyFileError(
                f"key file {where}, line {number}: not a key (expected 43 base64url characters of 32 bytes); "
                "fix or delete the line, or make a new file with `relay keygen`"
            )
        if key in seen:
            raise KeyFileError(
                f"key file {where}, line {number}: repeats the key of line {seen[key]}; delete it"
            )
        seen[key] = number
        keys.append(key)
    if not keys:
        raise KeyFileError(f"key file {where} has no key, only comments; {keygen} --force")
    return KeyRing(keys)


_KEY_FILE_HEADER = (
    "# relay agent MCP signing keys: one per line; the first signs, every one verifies.\n"
    "# To rotate, put a new key (`relay keygen`) on the first line and delete the old one\n"
    "# once the tokens it signed have expired. Keep this file mode 0600.\n"
)


def write_key_file(path: str | os.PathLike[str], force: bool = False) -> str:
    """Write a new key file (mode 0600) holding one fresh key; return that key's id.

    Without ``force`` an existing path is refused; with it the file is replaced atomically.
    """
    where = Path(path)
    key = secrets.token_bytes(KEY_BYTES)
    content = (_KEY_FILE_HEADER + _b64encode(key) + "\n").encode("ascii")
    try:
        if not force:
            try:
                fd = os.open(where, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
            except FileExistsError:
                raise KeyFileError(
                    f"{where} already exists; pass --force to replace it "
                    "(tokens signed by its keys stop verifying)"
                ) from None
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content)
                    handle.flush()
                    os.fsync(handle.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(where)
                raise
        else:
            if where.is_dir():
                raise KeyFileError(f"{where} is a directory; give a file path")
            fd, temp = tempfile.mkstemp(prefix=f".{where.name}.", suffix=".tmp", dir=where.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(content)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, where)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
    except KeyFileError:
        raise
    except FileNotFoundError:
        raise KeyFileError(f"directory {where.parent} does not exist; create it first") from None
    except OSError as exc:
        raise KeyFileError(f"cannot write {where} ({exc.strerror})") from None
    return key_id(key)


# --- middleware ------------------------------------------------------------------------------------


class AgentAuthMiddleware:
    """Pure ASGI middleware in front of the MCP endpoint (not ``BaseHTTPMiddleware``: responses stream).

    A verified request gets ``scope["state"]["agent"] = AgentIdentity`` and ``scope["user"]`` (which the
    MCP SDK uses to bind sessions to their caller); any other gets 401 with a JSON-RPC error body.
    """

    def __init__(self, app: ASGIApp, keyring: KeyRing) -> None:
        self.app = app
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = {b"authorization": "", b"x-csf-agent-id": "", b"x-csf-session-id": ""}
        found: set[bytes] = set()
        for name, value in scope.get("headers", ()):
            lowered = bytes(name).lower()
            if lowered in wanted and lowered not in found:
                found.add(lowered)
                wanted[lowered] = bytes(value).decode("latin-1").strip()
        scheme, _, credentials = wanted[b"authorization"].partition(" ")
        token = credentials.strip() if scheme.lower() == "bearer" else ""
        try:
            identity = self.keyring.verify(token, wanted[b"x-csf-agent-id"], wanted[b"x-csf-session-id"])
        except AuthError as exc:
            client = scope.get("client")
            log.info(
                "agent authentication refused",
                extra={
                    "cause": exc.cause,
                    "client": client[0] if client else None,
                    "path": scope.get("path"),
                },
            )
            await _refuse(send, exc)
            return
        scope.setdefault("state", {})["agent"] = identity
        scope["user"] = _authenticated_user(identity)
        await self.app(scope, receive, send)


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


async def _refuse(send: Send, error: AuthError) -> None:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32001,
                "message": f"unauthorized: {error.cause}: {error.message}",
                "data": {"cause": error.cause},
            },
        },
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")
    challenge = f'Bearer realm="relay", error="invalid_token", error_description="{error.cause}"'
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"www-authenticate", challenge.encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
