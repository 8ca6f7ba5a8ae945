"""Who may use the dashboard: operator login tokens, session cookies and CSRF tokens.

An operator proves they hold the relay's signing key: ``relay dashboard-url`` mints a short-lived login
token with it, the first load of ``/ui/login?token=...`` spends the token (once) and answers with a
session cookie (HttpOnly, SameSite=Strict, path ``/ui``). Spent login tokens are recorded in the
relay's store (``broker.ports.ISpentTokens``), so a login URL works once across every worker and
restart. Both are JWTs (HS256, PyJWT) prefixed
``ui1.``, signed with a key derived from each relay key (``KeyRing.derived``), never with the key
itself: an agent token cannot pass as a dashboard token nor the other way round, even though one key
file backs both. The audience and the ``use`` claim (``login`` or ``session``) keep the two dashboard
tokens apart. State-changing requests carry ``X-Relay-CSRF``, an HMAC of the session id the page reads
from ``/ui/api/session`` (a cross-site page can neither read it nor send the cookie).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final, Literal

import jwt

from broker.front.tokens import KeyRing
from broker.ports import ISpentTokens

PREFIX: Final = "ui1."
AUDIENCE: Final = "relay-dashboard"
LOGIN_PURPOSE: Final = b"relay dashboard login v1"
SESSION_PURPOSE: Final = b"relay dashboard session v1"
CSRF_PURPOSE: Final = b"relay dashboard csrf v1"
DEFAULT_LOGIN_TTL: Final = 300
"""Seconds a login URL stays usable."""
MAX_LOGIN_TTL: Final = 3600
SESSION_TTL: Final = 12 * 3600
"""Seconds a dashboard session lasts; then the operator asks ``relay dashboard-url`` again."""
MAX_TOKEN_CHARS: Final = 2048
CLOCK_SKEW: Final = 60
"""Seconds a token's ``iat`` may lie ahead of this clock; a spent id is also kept this much longer
than its token lives, for workers whose clocks differ."""

Use = Literal["login", "session"]


class AccessDenied(Exception):
    """A dashboard token that does not verify; the message says why, for the operator."""


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    expires_at: int


class OperatorAccess:
    """Mints and checks dashboard tokens with keys derived from a relay key ring; ``spent`` records the
    login tokens spent (without it, minting only: every login is refused)."""

    def __init__(self, keyring: KeyRing, spent: ISpentTokens | None = None) -> None:
        self._spent = spent
        self.use(keyring)

    def use(self, keyring: KeyRing) -> None:
        """Verify with ``keyring`` from now on (``relay serve`` reloads its key file on SIGHUP)."""
        self._keys = {purpose: keyring.derived(purpose) for purpose in (LOGIN_PURPOSE, SESSION_PURPOSE)}
        self._csrf_key = keyring.derived(CSRF_PURPOSE)[0][1]

    def mint_login(self, ttl: int = DEFAULT_LOGIN_TTL, now: float | None = None) -> str:
        if not 1 <= ttl <= MAX_LOGIN_TTL:
            raise ValueError(f"a login token lives 1 to {MAX_LOGIN_TTL} seconds")
        return self._mint("login", LOGIN_PURPOSE, ttl, secrets.token_urlsafe(16), now)

    async def login(self, token: str, now: float | None = None) -> tuple[str, Session]:
        """Spend a login token: a new session and its cookie value. A token works once, on every worker
        of the relay. Raises ``AccessDenied``, or what ``ISpentTokens.spend`` raises (the store does
        not answer: nobody is let in)."""
        claims = self._verify(token, "login", LOGIN_PURPOSE, now)
        current = int(time.time() if now is None else now)
        if self._spent is None:
            raise AccessDenied("this process takes no dashboard logins")
        exp = int(str(claims["exp"]))
        if not await self._spent.spend(str(claims["jti"]), (exp - current + CLOCK_SKEW) * 1000):
            raise AccessDenied("this login URL was used already; run `relay dashboard-url` for a new one")
        sid = secrets.token_urlsafe(18)
        cookie = self._mint("session", SESSION_PURPOSE, SESSION_TTL, sid, now)
        return cookie, Session(sid, current + SESSION_TTL)

    def session(self, cookie: str | None, now: float | None = None) -> Session:
        if not cookie:
            raise AccessDenied("no dashboard session")
        claims = self._verify(cookie, "session", SESSION_PURPOSE, now)
        return Session(str(claims["jti"]), int(str(claims["exp"])))

    def csrf(self, session: Session) -> str:
        digest = hmac.new(self._csrf_key, session.sid.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def check_csrf(self, session: Session, header: str | None) -> bool:
        return bool(header) and hmac.compare_digest(self.csrf(session), str(header))

    def _mint(self, use: Use, purpose: bytes, ttl: int, jti: str, now: float | None) -> str:
        kid, key = self._keys[purpose][0]
        iat = int(time.time() if now is None else now)
        claims = {"aud": AUDIENCE, "use": use, "jti": jti, "iat": iat, "exp": iat + ttl}
        return PREFIX + jwt.encode(claims, key, algorithm="HS256", headers={"kid": kid})

    def _verify(self, token: str, use: Use, purpose: bytes, now: float | None) -> dict[str, object]:
        if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > MAX_TOKEN_CHARS:
            raise AccessDenied("not a dashboard token; run `relay dashboard-url` for a login URL")
        signed = token[len(PREFIX) :]
        try:
            kid = jwt.get_unverified_header(signed).get("kid")
        except jwt.PyJWTError:
            raise AccessDenied("not a dashboard token; run `relay dashboard-url` for a login URL") from None
        key = dict(self._keys[purpose]).get(str(kid))
        if key is None:
            raise AccessDenied("signed with a key this relay does not hold; run `relay dashboard-url` again")
        try:
            claims: dict[str, object] = jwt.decode(
                signed,
                key,
                algorithms=["HS256"],
                audience=AUDIENCE,
                options={"require": ["exp", "iat", "jti", "aud", "use"], "verify_exp": False},
            )
        except jwt.PyJWTError:
            raise AccessDenied("the token does not verify; run `relay dashboard-url` for a new one") from None
        current = int(time.time() if now is None else now)
        exp, iat = claims.get("exp"), claims.get("iat")
        if claims.get("use") != use or not isinstance(exp, int) or not isinstance(iat, int):
            raise AccessDenied("not a dashboard token of this kind; run `relay dashboard-url`")
        if current >= exp:
            raise AccessDenied("the token has expired; run `relay dashboard-url` for a new login URL")
        if iat > current + CLOCK_SKEW:
            raise AccessDenied("the token was issued in the future; check the clocks")
        return claims
