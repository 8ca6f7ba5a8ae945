"""Agent identity tokens for ``/mcp/agent``: the v1 format, signing keys and the key ring.

Every request carries three headers minted by the host that holds the signing key
(``relay agent-headers``)::

    Authorization: Bearer v1.<payload>.<sig>
    X-CSF-Agent-ID: <agent>
    X-CSF-Session-ID: <session>

``payload`` is base64url (no padding) of compact, key-sorted JSON
``{"agent", "session", "iat", "exp", "kid"}``; ``sig`` is base64url of HMAC-SHA256 over the ASCII bytes
``"v1." + payload`` with the key whose id (first 8 hex characters of its SHA-256) is ``kid``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from broker.errors import InvalidArgument, RelayError
from broker.ids import check_agent_id, check_session_id

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
_KID = re.compile(r"[0-9a-f]{8}")
_VERSION = re.compile(r"v[0-9]+")
_CLAIMS: Final = frozenset({"agent", "session", "iat", "exp", "kid"})


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


def b64url_encode(data: bytes) -> str:
    """Base64url without padding, as tokens and key files write it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes | None:
    """Strict base64url without padding; None unless ``text`` is the canonical encoding of something."""
    if _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        return None
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return data if b64url_encode(data) == text else None


def key_id(key: bytes) -> str:
    """The id a token names its signing key by: the first 8 hex characters of SHA-256(key)."""
    return hashlib.sha256(key).hexdigest()[:8]


def generate_key() -> str:
    """A new signing key: base64url (no padding) of 32 random bytes."""
    return b64url_encode(secrets.token_bytes(KEY_BYTES))


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
        payload = b64url_encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("ascii"))
        return f"{TOKEN_VERSION}.{payload}.{self._sign(self._keys[self._signing], payload)}"

    @staticmethod
    def _sign(key: bytes, payload: str) -> str:
        signed = f"{TOKEN_VERSION}.{payload}".encode("ascii")
        return b64url_encode(hmac.new(key, signed, hashlib.sha256).digest())

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
        raw = b64url_decode(payload)
        sig = b64url_decode(sig_text)
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
