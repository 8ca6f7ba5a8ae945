"""Per-agent credentials: what an agent folder holds instead of relay's signing key.

A credential is ``<id>.<secret>``: ``id`` names its record (``cr_`` and 20 base32 characters), the
secret is 32 random bytes (``secrets.token_urlsafe``). The store keeps only the secret's SHA-256
(``secret_hash``), compared in constant time (``hmac.compare_digest``), with the agent it may act
as, a label, when it was created, last used and expires, its audience (the listener it may be exchanged
on: ``loopback`` or ``network``) and when it was revoked. ``POST /agent/token`` exchanges it for the
short-lived signed token the agent endpoint checks (``broker.front.token_route``); the signing key
itself stays with the operator.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, replace
from typing import Final, Literal

from broker.errors import InvalidArgument
from broker.ids import check_agent_id

Audience = Literal["loopback", "network"]
AUDIENCES: Final[tuple[Audience, ...]] = ("loopback", "network")

CredentialEvent = Literal["issued", "exchanged", "revoked", "refused"]
EVENTS: Final[tuple[CredentialEvent, ...]] = ("issued", "exchanged", "revoked", "refused")
"""What ``csf_relay_credentials_total{event}`` counts, and what the audit log names."""

ID_PREFIX: Final = "cr_"
ID_PATTERN: Final = r"cr_[a-z2-7]{20}"
_ID_RE: Final = re.compile(ID_PATTERN)
_SECRET_RE: Final = re.compile(r"[A-Za-z0-9_-]{43}")
SECRET_BYTES: Final = 32
MAX_LABEL_CHARS: Final = 200
MAX_CREDENTIAL_CHARS: Final = 128
"""A credential is 67 characters; a longer bearer value is not one (refused before any lookup)."""

_DURATION: Final = re.compile(r"([1-9][0-9]{0,6})([smhdw])")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
MAX_EXPIRY_SECONDS: Final = 10 * 365 * 86_400


@dataclass(frozen=True, slots=True)
class Credential:
    """One issued credential as the store keeps it (times in Unix milliseconds)."""

    id: str
    agent: str
    label: str
    audience: Audience
    secret_hash: str
    """Hex SHA-256 of the secret: the secret itself is shown once and never stored."""
    created_at_ms: int
    expires_at_ms: int | None = None
    last_used_at_ms: int | None = None
    revoked_at_ms: int | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at_ms is not None

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms is not None and now_ms >= self.expires_at_ms

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this credential's, in constant time (both sides are 64 hex digits)."""
        return hmac.compare_digest(hash_secret(secret), self.secret_hash)

    def revoked_at(self, now_ms: int) -> Credential:
        return self if self.revoked else replace(self, revoked_at_ms=now_ms)

    def used_at(self, now_ms: int) -> Credential:
        return replace(self, last_used_at_ms=now_ms)

    def public(self) -> dict[str, object]:
        """What ``relay credentials list --json`` shows: everything but the hash."""
        return {
            "id": self.id,
            "agent": self.agent,
            "label": self.label,
            "audience": self.audience,
            "created_at_ms": self.created_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "last_used_at_ms": self.last_used_at_ms,
            "revoked": self.revoked,
            "revoked_at_ms": self.revoked_at_ms,
        }


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def is_credential_id(text: str) -> bool:
    return _ID_RE.fullmatch(text) is not None


def check_credential_id(text: str, field: str = "id") -> str:
    if not isinstance(text, str) or not is_credential_id(text):
        raise InvalidArgument(
            field, "credential_id.pattern", f"is not a credential id (`{ID_PREFIX}` and 20 of a-z, 2-7)"
        )
    return text


def new_credential(
    agent: str,
    *,
    label: str = "",
    audience: Audience = "loopback",
    now_ms: int,
    expires_in_s: int | None = None,
) -> tuple[Credential, str]:
    """A fresh credential for ``agent`` and its text ``<id>.<secret>`` (shown once, stored nowhere)."""
    check_agent_id(agent, "--agent")
    if len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise InvalidArgument(
            "--label", "label.text", f"use at most {MAX_LABEL_CHARS} printable characters (no newlines)"
        )
    if audience not in AUDIENCES:
        raise InvalidArgument("audience", "audience.value", f"must be one of {', '.join(AUDIENCES)}")
    ident = ID_PREFIX + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz234567") for _ in range(20))
    secret = secrets.token_urlsafe(SECRET_BYTES)
    expires = None if expires_in_s is None else now_ms + expires_in_s * 1000
    record = Credential(ident, agent, label, audience, hash_secret(secret), now_ms, expires)
    return record, f"{ident}.{secret}"


def split(credential: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a credential's text; None when it is not shaped like one."""
    if not isinstance(credential, str) or len(credential) > MAX_CREDENTIAL_CHARS:
        return None
    ident, dot, secret = credential.partition(".")
    if not dot or not is_credential_id(ident) or _SECRET_RE.fullmatch(secret) is None:
        return None
    return ident, secret


def parse_duration(text: str, field: str = "--expires") -> int:
    """Seconds of a duration such as ``90s``, ``15m``, ``12h``, ``30d`` or ``8w``."""
    found = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    seconds = int(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else 0
    if not found or seconds > MAX_EXPIRY_SECONDS:
        raise InvalidArgument(
            field,
            "duration.format",
            f"{text!r} is not a duration: a whole number and one of s, m, h, d, w (e.g. 30d), at most "
            f"{MAX_EXPIRY_SECONDS // 86_400} days",
        )
    return seconds
