"""Agent identity tokens for ``/mcp/agent``: the v1 format, signing keys and the key ring.

Every request carries three headers minted by the host that holds the signing key
(``relay agent-headers``)::

    Authorization: Bearer v1.<JWT>
    X-CSF-Agent-ID: <agent>
    X-CSF-Session-ID: <session>

The part after ``v1.`` is a compact JSON Web Token built and checked with PyJWT: header
``{"alg": "HS256", "kid", "typ": "JWT"}``, claims ``{"agent", "session", "iat", "exp"}`` and, when the
minter names one, ``"aud"``; a token exchanged for a per-agent credential (``POST /agent/token``,
``broker.front.token_route``) also names that credential's id as ``"cid"``, so the front can refuse it
once the credential is revoked. ``kid`` is the first 8 hex characters of the SHA-256 of the signing key.
Only HS256 is accepted (a token naming ``none`` or any other algorithm is refused before any key is
used), the signature is compared in constant time (PyJWT's ``hmac.compare_digest``), and every claim
is checked strictly after the signature verified: a signed token with a missing, extra or mistyped
claim is refused as well. ``exp`` and ``iat`` are checked by relay (``CLOCK_SKEW_SECONDS`` of grace
for a minting host's clock running ahead), so that the verified-token cache checks them on every hit.
A token's ``aud`` claim must equal the audience of the listener that verifies it: a token without one
is for a listener that serves none (the loopback listener), and one with ``aud`` = ``NETWORK_AUDIENCE``
only for the network listener, so a token minted for one listener is refused by the other.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import jwt

from broker.credentials import ID_PATTERN
from broker.errors import InvalidArgument, RelayError
from broker.ids import check_agent_id, check_session_id

TOKEN_VERSION: Final = "v1"  # noqa: S105 - a format tag, not a secret
ALGORITHM: Final = "HS256"
KEY_BYTES: Final = 32
MAX_TOKEN_CHARS: Final = 4096
MAX_TTL_SECONDS: Final = 31_536_000
DEFAULT_TTL_SECONDS: Final = 86_400
CLOCK_SKEW_SECONDS: Final = 60
NETWORK_AUDIENCE: Final = "network"
"""The ``aud`` of tokens for the network listener (``relay agent-headers --network``)."""
VERIFIED_CACHE_SIZE: Final = 1024
"""Verified tokens a key ring remembers (the least recently used goes first)."""
MAX_CACHED_TOKEN_CHARS: Final = 1024
"""Longer tokens verify every time (a relay-minted token is about 250 characters)."""

AGENT_HEADER: Final = "X-CSF-Agent-ID"
SESSION_HEADER: Final = "X-CSF-Session-ID"

AuthCause = Literal[
    "missing_authorization",
    "malformed_authorization",
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
    "wrong_audience",
    "unknown_credential",
    "revoked",
    "wrong_agent",
]

_REMINT = "mint new headers with `relay agent-headers`"
AUTH_MESSAGES: Final[dict[AuthCause, str]] = {
    "missing_authorization": f"send `Authorization: Bearer v1.…`; {_REMINT}",
    "malformed_authorization": f"the Authorization header must be `Bearer v1.…`; {_REMINT}",
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
    "wrong_audience": f"the token was minted for another listener; {_REMINT}",
    "unknown_credential": "the credential is not one this relay issued (or its secret is wrong); issue one "
    "with `relay credentials issue`, or re-run `relay setup claude-code` in the agent's folder",
    "revoked": "the credential was revoked; issue a new one with `relay credentials issue` (or re-run "
    "`relay setup claude-code` in the agent's folder)",
    "wrong_agent": "the credential acts as another agent; ask with the agent it was issued for",
}

# v1 then three base64url segments; the signature is the canonical encoding of 32 bytes (its last
# character carries 2 bits of padding, which must be zero), so one signature has one spelling.
_SHAPE = re.compile(r"v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]")
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_KID = re.compile(r"[0-9a-f]{8}")
_AUDIENCE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_VERSION = re.compile(r"v[0-9]+")
_CID = re.compile(ID_PATTERN)
_HEADER_FIELDS: Final = frozenset({"alg", "kid", "typ"})
_CLAIMS: Final = frozenset({"agent", "session", "iat", "exp"})
# PyJWT checks the signature and the algorithm; relay checks every claim itself (see the docstring).
_DECODE_OPTIONS: Final = jwt.types.Options(
    verify_signature=True,
    verify_exp=False,
    verify_nbf=False,
    verify_iat=False,
    verify_aud=False,
    verify_iss=False,
    verify_sub=False,
    verify_jti=False,
    require=[],
)


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
    credential: str | None = None
    """The credential id a token exchanged at ``POST /agent/token`` names (None: minted with the key)."""


@dataclass(frozen=True, slots=True)
class _Signed:
    """What a token's verified signature vouches for; the times and headers are checked per request."""

    identity: AgentIdentity
    issued_at: int
    audience: str | None


def b64url_encode(data: bytes) -> str:
    """Base64url without padding, as key files write keys."""
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


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization`` header value; '' when there is none. Any other scheme, or
    ``Bearer`` without a token, is ``malformed_authorization``."""
    if not authorization:
        return ""
    scheme, _, credentials = authorization.partition(" ")
    token = credentials.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError("malformed_authorization")
    return token


class KeyRing:
    """Signing keys: the first signs, every one verifies."""

    __slots__ = ("_keys", "_signed", "_signing")

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
        # An agent sends the same token on every call: what its signature vouches for is kept (only
        # tokens that verified; a refusal raises and is not cached), and the time, header and audience
        # checks run again on every call. The cache lives and dies with this key ring, so a reloaded
        # key file starts empty.
        self._signed = functools.lru_cache(maxsize=VERIFIED_CACHE_SIZE)(self._check_signed)

    @property
    def signing_kid(self) -> str:
        return self._signing

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(signing={self._signing!r}, kids={self.kids!r})"

    def derived(self, purpose: bytes) -> list[tuple[str, bytes]]:
        """``(kid, key)`` for every key, the signing one first, each HMAC-SHA256(key, ``purpose``): keys
        for another kind of token (e.g. the dashboard's) whose signatures can never pass as this ring's."""
        order = [self._signing, *(kid for kid in self._keys if kid != self._signing)]
        return [(kid, hmac.new(self._keys[kid], purpose, hashlib.sha256).digest()) for kid in order]

    def mint(
        self,
        agent: str,
        session: str,
        ttl_seconds: int = DEFAULT_TTL_SECONDS,
        now: float | None = None,
        *,
        audience: str | None = None,
        credential: str | None = None,
    ) -> str:
        """A v1 token for ``agent`` in ``session``, valid for ``ttl_seconds`` (1 s to 1 year); with
        ``audience``, only a verifier serving that audience accepts it; with ``credential``, the token
        names that credential's id (``cid``) and lives only while it is not revoked."""
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
        if audience is not None and _AUDIENCE.fullmatch(audience) is None:
            raise InvalidArgument(
                "audience", "audience.pattern", "use 1-64 lowercase letters, digits, '.', '_', '-'"
            )
        iat = int(time.time() if now is None else now)
        claims: dict[str, object] = {"agent": agent, "session": session, "iat": iat, "exp": iat + ttl_seconds}
        if audience is not None:
            claims["aud"] = audience
        if credential is not None:
            if _CID.fullmatch(credential) is None:
                raise InvalidArgument("credential", "credential_id.pattern", "is not a credential id")
            claims["cid"] = credential
        signed = jwt.encode(
            claims, self._keys[self._signing], algorithm=ALGORITHM, headers={"kid": self._signing}
        )
        return f"{TOKEN_VERSION}.{signed}"

    def verify(
        self,
        token: str | None,
        agent_header: str | None,
        session_header: str | None,
        now: float | None = None,
        *,
        audience: str | None = None,
    ) -> AgentIdentity:
        """The identity ``token`` proves for these headers, or ``AuthError`` naming the first failure.
        ``audience`` is the listener's (None for one that serves none): a token naming another audience,
        or naming none when the listener has one, is refused."""
        if not token:
            raise AuthError("missing_authorization")
        if not agent_header:
            raise AuthError("missing_agent_header")
        if not session_header:
            raise AuthError("missing_session_header")
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise AuthError("malformed_token")
        signed = self._signed(token) if len(token) <= MAX_CACHED_TOKEN_CHARS else self._check_signed(token)
        identity = signed.identity
        current = int(time.time() if now is None else now)
        if current >= identity.expires_at:
            raise AuthError("expired")
        if signed.issued_at > current + CLOCK_SKEW_SECONDS:
            raise AuthError("not_yet_valid")
        if agent_header != identity.agent:
            raise AuthError("agent_mismatch")
        if session_header != identity.session:
            raise AuthError("session_mismatch")
        if signed.audience != audience:
            raise AuthError("wrong_audience")
        return identity

    def _check_signed(self, token: str) -> _Signed:
        """The signature and claims of ``token``, which must be a v1 token of a key in this ring."""
        if _SHAPE.fullmatch(token) is None:
            version = token.partition(".")[0]
            if version != TOKEN_VERSION and _VERSION.fullmatch(version) is not None:
                raise AuthError("unsupported_token_version")
            raise AuthError("malformed_token")
        signed = token[len(TOKEN_VERSION) + 1 :]
        header = _header(signed)
        # Only the header is read before the signature is checked; nothing in it is trusted but the
        # key id, and the algorithm is pinned whatever the header says.
        if header.get("alg") != ALGORITHM:
            raise AuthError("malformed_token", f"only {ALGORITHM} tokens are accepted; {_REMINT}")
        kid = header.get("kid")
        if (
            not header.keys() <= _HEADER_FIELDS
            or header.get("typ", "JWT") != "JWT"
            or not isinstance(kid, str)
            or _KID.fullmatch(kid) is None
        ):
            raise AuthError("malformed_token")
        key = self._keys.get(kid)
        if key is None:
            raise AuthError("unknown_key")
        try:
            claims = jwt.decode(signed, key, algorithms=[ALGORITHM], options=_DECODE_OPTIONS)
        except jwt.InvalidSignatureError:
            raise AuthError("bad_signature") from None
        except jwt.PyJWTError:
            raise AuthError("malformed_token") from None
        return _check_claims(claims)


def _header(signed: str) -> dict[str, object]:
    """The JWT header of ``signed``, read before anything is verified (PyJWT reads it again with the
    signature: reading it here costs a tenth of that, and a refused header never reaches it)."""
    raw = b64url_decode(signed.partition(".")[0])
    try:
        header = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise AuthError("malformed_token")
    return header


def _check_claims(claims: dict[str, object]) -> _Signed:
    """Strict shape of signed claims (a signed token from a buggy minter is still refused)."""
    audience = claims.get("aud")
    cid = claims.get("cid")
    if (
        set(claims) - {"aud", "cid"} != _CLAIMS
        or ("aud" in claims and not (isinstance(audience, str) and _AUDIENCE.fullmatch(audience)))
        or ("cid" in claims and not (isinstance(cid, str) and _CID.fullmatch(cid)))
    ):
        raise AuthError("malformed_token")
    agent, session, iat, exp = claims["agent"], claims["session"], claims["iat"], claims["exp"]
    if not isinstance(iat, int) or isinstance(iat, bool) or not isinstance(exp, int) or isinstance(exp, bool):
        raise AuthError("malformed_token")
    if iat < 0 or exp <= iat:
        raise AuthError("malformed_token")
    try:
        identity = AgentIdentity(
            check_agent_id(agent), check_session_id(session), exp, cid if isinstance(cid, str) else None
        )
    except InvalidArgument:
        raise AuthError("malformed_token") from None
    return _Signed(identity, iat, audience if isinstance(audience, str) else None)


def agent_headers(
    keyring: KeyRing,
    agent: str,
    session: str,
    ttl: int = DEFAULT_TTL_SECONDS,
    now: float | None = None,
    *,
    audience: str | None = None,
) -> dict[str, str]:
    """The three headers an agent sends on every ``/mcp/agent`` request (of the listener that serves
    ``audience``)."""
    token = keyring.mint(agent, session, ttl, now=now, audience=audience)
    return {"Authorization": f"Bearer {token}", AGENT_HEADER: agent, SESSION_HEADER: session}
