"""Tests for agent authentication: v1 tokens (broker.front.tokens), key files (broker.front.key_file)
and the ASGI middleware (broker.front.auth) on a real socket."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import httpx2
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from broker.errors import InvalidArgument
from broker.front import tokens
from broker.front.auth import AgentAuthMiddleware
from broker.front.key_file import KeyFileError, load_key_file, write_key_file
from broker.front.tokens import (
    AgentIdentity,
    AuthError,
    KeyRing,
    agent_headers,
    bearer_token,
    generate_key,
    key_id,
)
from broker.testing.polling import eventually

NOW = 1_800_000_000
AGENT = "alice"
SESSION = "sess-1"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_key() -> bytes:
    return secrets.token_bytes(32)


def compact(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def forge(
    key: bytes,
    claims: Any,
    *,
    version: str = "v1",
    header: Any = None,
    raw: bytes | None = None,
    digest: Any = hashlib.sha256,
) -> str:
    """A token signed with ``key`` over arbitrary header and claims, written without PyJWT (to pin the
    format and to reach the checks after the signature)."""
    if header is None:
        header = {"alg": "HS256", "kid": key_id(key), "typ": "JWT"}
    signing_input = f"{b64(compact(header))}.{b64(raw if raw is not None else compact(claims))}"
    sig = hmac.new(key, signing_input.encode(), digest).digest()
    return f"{version}.{signing_input}.{b64(sig)}"


def claims_for(**overrides: object) -> dict[str, object]:
    claims: dict[str, object] = {"agent": AGENT, "session": SESSION, "iat": NOW, "exp": NOW + 3600}
    claims.update(overrides)
    return claims


def cause_of(
    ring: KeyRing,
    token: str | None,
    agent: str | None = AGENT,
    session: str | None = SESSION,
    audience: str | None = None,
) -> str:
    with pytest.raises(AuthError) as info:
        ring.verify(token, agent, session, now=NOW, audience=audience)
    return info.value.cause


# --- tokens ----------------------------------------------------------------------------------------


def test_mint_verify_round_trip() -> None:
    ring = KeyRing([new_key()])
    token = ring.mint(AGENT, SESSION, ttl_seconds=600, now=NOW)
    assert token.startswith("v1.")
    assert ring.verify(token, AGENT, SESSION, now=NOW + 599) == AgentIdentity(AGENT, SESSION, NOW + 600)


def test_token_format_is_exact() -> None:
    """v1. then an HS256 JWT: header {alg, kid, typ}, claims {agent, session, iat, exp}, HMAC-SHA256 of
    header.payload; checked here with hmac and base64 only."""
    key = new_key()
    token = KeyRing([key]).mint(AGENT, SESSION, ttl_seconds=600, now=NOW)
    version, header, payload, sig = token.split(".")
    assert version == "v1" and "=" not in token
    assert json.loads(unb64(header)) == {
        "alg": "HS256",
        "kid": hashlib.sha256(key).hexdigest()[:8],
        "typ": "JWT",
    }
    assert json.loads(unb64(payload)) == {"agent": AGENT, "session": SESSION, "iat": NOW, "exp": NOW + 600}
    assert sig == b64(hmac.new(key, f"{header}.{payload}".encode("ascii"), hashlib.sha256).digest())


def test_a_forged_token_in_the_documented_format_verifies() -> None:
    key = new_key()
    assert KeyRing([key]).verify(forge(key, claims_for()), AGENT, SESSION, now=NOW).expires_at == NOW + 3600


def test_mint_validates_arguments() -> None:
    ring = KeyRing([new_key()])
    for agent, session in [("Bad:Id", SESSION), ("", SESSION), (AGENT, "bad session"), (AGENT, "")]:
        with pytest.raises(InvalidArgument):
            ring.mint(agent, session)
    for ttl in (0, -1, 31_536_001, True):
        with pytest.raises(InvalidArgument):
            ring.mint(AGENT, SESSION, ttl_seconds=ttl)
    with pytest.raises(InvalidArgument):
        ring.mint(AGENT, SESSION, audience="Not An Audience")
    assert ring.mint(AGENT, SESSION, ttl_seconds=31_536_000, now=NOW)


def test_missing_headers() -> None:
    ring = KeyRing([new_key()])
    token = ring.mint(AGENT, SESSION, now=NOW)
    assert cause_of(ring, None) == "missing_authorization"
    assert cause_of(ring, "") == "missing_authorization"
    assert cause_of(ring, token, agent=None) == "missing_agent_header"
    assert cause_of(ring, token, agent="") == "missing_agent_header"
    assert cause_of(ring, token, session=None) == "missing_session_header"
    assert cause_of(ring, token, session="") == "missing_session_header"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ""),
        ("Bearer v1.x", "v1.x"),
        ("bearer   v1.x ", "v1.x"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("v1.abc.def.ghi", None),
        ("Token v1.x", None),
    ],
)
def test_the_authorization_header_is_bearer_or_malformed(value: str, expected: str | None) -> None:
    if expected is not None:
        assert bearer_token(value) == expected
        return
    with pytest.raises(AuthError) as info:
        bearer_token(value)
    assert info.value.cause == "malformed_authorization"


@pytest.mark.parametrize(
    "token",
    [
        "no-dots-at-all",
        "v1",
        "v1.",
        "v1..",
        "v1...",
        "v1.a.b.c",
        "v1.!!!.abc.def",
        "v1.eyJ.abc",
        "V1.eyJhIjoxfQ.eyJhIjoxfQ." + "A" * 43,
        "v1." + "A" * 5000,
        "v1.eyJhIjoxfQ.eyJhIjoxfQ.AAAA",  # signature of the wrong length
        "v1.eyJhIjoxfQ.eyJhIjoxfQ." + "A" * 42 + "B",  # a non-canonical spelling of 32 bytes
        "v1.ümlaut.eyJhIjoxfQ." + "A" * 43,
        "v1.eyJhIjoxfQ=.eyJhIjoxfQ." + "A" * 43,  # padding is not allowed
        "v1.eyJhIjoxfQ.eyJhIjoxfQ.eyJhIjoxfQ." + "A" * 43,  # too many segments
        "v1.eyJhIjoxfQ." + "A" * 43,  # the old two-segment layout
    ],
)
def test_malformed_shapes(token: str) -> None:
    assert cause_of(KeyRing([new_key()]), token) == "malformed_token"


def test_malformed_headers_are_refused_before_any_key_is_used() -> None:
    key = new_key()
    ring = KeyRing([key])
    kid = key_id(key)
    for header in [
        {"alg": "none", "kid": kid, "typ": "JWT"},
        {"alg": "HS512", "kid": kid, "typ": "JWT"},
        {"alg": "RS256", "kid": kid},
        {"alg": "hs256", "kid": kid},
        {"kid": kid},
        {"alg": "HS256"},  # no kid
        {"alg": "HS256", "kid": 12345678},
        {"alg": "HS256", "kid": "NOTHEX!!"},
        {"alg": "HS256", "kid": kid, "typ": "JWS"},
        {"alg": "HS256", "kid": kid, "crit": ["exp"]},
        {"alg": "HS256", "kid": kid, "jku": "https://evil.example/keys"},
        ["alg", "HS256"],
        "HS256",
    ]:
        assert cause_of(ring, forge(key, claims_for(), header=header)) == "malformed_token", header
    # alg none with an empty signature, as the classic attack sends it
    unsigned = f"v1.{b64(compact({'alg': 'none', 'kid': kid}))}.{b64(compact(claims_for()))}."
    assert cause_of(ring, unsigned) == "malformed_token"
    # the HS256 header over a signature of another hash: not 32 bytes, so not even a signature
    assert cause_of(ring, forge(key, claims_for(), digest=hashlib.sha512)) == "malformed_token"
    assert cause_of(ring, forge(key, claims_for(), digest=hashlib.sha1)) == "malformed_token"


def test_malformed_payloads() -> None:
    key = new_key()
    ring = KeyRing([key])
    bad_payloads: list[bytes] = [
        b"not json",
        b"\xff\xfe\x00",
        b"[1, 2, 3]",
        b'"just a string"',
        b"[" * 2000 + b"]" * 2000,  # deep nesting must not escape as RecursionError
    ]
    for raw in bad_payloads:
        assert cause_of(ring, forge(key, None, raw=raw)) == "malformed_token", raw[:40]


@pytest.mark.parametrize(
    "change",
    [
        {"agent": None},
        {"session": None},
        {"iat": None},
        {"exp": None},
        {"agent": 7},
        {"session": ["x"]},
        {"iat": "1800000000"},
        {"exp": 1.5e9},
        {"exp": True},
        {"iat": -5},
        {"exp": NOW},  # exp must come after iat
        {"agent": "Bad:Id"},
        {"session": "has space"},
        {"extra": "field"},
        {"kid": "abcdef01"},  # the key id belongs in the header
        {"aud": ""},
        {"aud": ["loopback"]},
        {"aud": "Has Space"},
        {"nbf": NOW},
    ],
)
def test_signed_but_malformed_claims(change: dict[str, object]) -> None:
    key = new_key()
    claims = claims_for()
    for name, value in change.items():
        if value is None:
            del claims[name]
        else:
            claims[name] = value
    assert cause_of(KeyRing([key]), forge(key, claims)) == "malformed_token"


def test_never_raises_anything_but_auth_error() -> None:
    ring = KeyRing([new_key()])
    for junk in [
        "v1.\x00.\x00",
        "v1." + "-" * 4000 + ".x",
        ".",
        "..",
        "v1.AA.AA",
        "v1.AA.AA." + "A" * 43,
        "v1.AAAAA.AAAAA." + "A" * 43,
        "v99999999999999999999.a.b",
    ]:
        with pytest.raises(AuthError):
            ring.verify(junk, AGENT, SESSION, now=NOW)


def test_unsupported_version() -> None:
    key = new_key()
    ring = KeyRing([key])
    assert cause_of(ring, forge(key, claims_for(), version="v2")) == "unsupported_token_version"
    assert cause_of(ring, "v0.abc.def") == "unsupported_token_version"


def test_tampered_tokens() -> None:
    key = new_key()
    ring = KeyRing([key])
    token = ring.mint(AGENT, SESSION, now=NOW)
    version, header, payload, sig = token.split(".")
    other_payload = b64(compact(claims_for(agent="mallory")))
    assert cause_of(ring, f"{version}.{header}.{other_payload}.{sig}", agent="mallory") == "bad_signature"
    flipped = sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:]
    assert cause_of(ring, f"{version}.{header}.{payload}.{flipped}") == "bad_signature"
    assert cause_of(ring, token[:-5]) == "malformed_token"
    assert cause_of(ring, f"{version}.{header}.{payload}") == "malformed_token"


def test_foreign_key() -> None:
    ring = KeyRing([new_key()])
    foreign = KeyRing([new_key()]).mint(AGENT, SESSION, now=NOW)
    assert cause_of(ring, foreign) == "unknown_key"
    # A token that claims a known kid but is signed by another key.
    key = new_key()
    assert cause_of(
        KeyRing([key]), forge(new_key(), claims_for(), header={"alg": "HS256", "kid": key_id(key)})
    ) == ("bad_signature")


def test_expiry_and_clock_skew() -> None:
    ring = KeyRing([new_key()])
    token = ring.mint(AGENT, SESSION, ttl_seconds=60, now=NOW)
    assert ring.verify(token, AGENT, SESSION, now=NOW + 59).expires_at == NOW + 60
    with pytest.raises(AuthError) as info:
        ring.verify(token, AGENT, SESSION, now=NOW + 60)
    assert info.value.cause == "expired"
    future = ring.mint(AGENT, SESSION, ttl_seconds=600, now=NOW + 61)
    assert cause_of(ring, future) == "not_yet_valid"
    assert ring.verify(ring.mint(AGENT, SESSION, now=NOW + 60), AGENT, SESSION, now=NOW).agent == AGENT


def test_a_cached_token_is_checked_again_on_every_call() -> None:
    """The verified-token cache keeps what the signature vouches for, never a verdict: expiry, headers
    and audience are checked on each call."""
    ring = KeyRing([new_key()])
    token = ring.mint(AGENT, SESSION, ttl_seconds=60, now=NOW, audience="loopback")
    assert ring.verify(token, AGENT, SESSION, now=NOW, audience="loopback").agent == AGENT
    with pytest.raises(AuthError, match="expired"):
        ring.verify(token, AGENT, SESSION, now=NOW + 60, audience="loopback")
    assert cause_of(ring, token, agent="bob", audience="loopback") == "agent_mismatch"
    assert cause_of(ring, token, session="other", audience="loopback") == "session_mismatch"
    assert cause_of(ring, token, audience="network") == "wrong_audience"
    assert ring.verify(token, AGENT, SESSION, now=NOW + 59, audience="loopback").expires_at == NOW + 60


def test_a_token_is_accepted_only_by_the_audience_it_names() -> None:
    ring = KeyRing([new_key()])
    scoped = ring.mint(AGENT, SESSION, now=NOW, audience="loopback")
    assert json.loads(unb64(scoped.split(".")[2]))["aud"] == "loopback"
    assert ring.verify(scoped, AGENT, SESSION, now=NOW, audience="loopback").agent == AGENT
    assert cause_of(ring, scoped) == "wrong_audience"  # a verifier that serves no audience
    assert cause_of(ring, scoped, audience="network") == "wrong_audience"
    unscoped = ring.mint(AGENT, SESSION, now=NOW)
    assert ring.verify(unscoped, AGENT, SESSION, now=NOW).agent == AGENT
    # a token without an audience (a host token) is refused where the verifier serves one
    assert cause_of(ring, unscoped, audience="network") == "wrong_audience"


def test_header_mismatch() -> None:
    ring = KeyRing([new_key()])
    token = ring.mint(AGENT, SESSION, now=NOW)
    assert cause_of(ring, token, agent="bob") == "agent_mismatch"
    assert cause_of(ring, token, session="sess-2") == "session_mismatch"


def test_rotation() -> None:
    old, new = new_key(), new_key()
    before = KeyRing([old])
    after = KeyRing([new, old])
    old_token = before.mint(AGENT, SESSION, now=NOW)
    assert after.verify(old_token, AGENT, SESSION, now=NOW).agent == AGENT
    new_token = after.mint(AGENT, SESSION, now=NOW)
    assert after.signing_kid == key_id(new)
    assert json.loads(unb64(new_token.split(".")[1]))["kid"] == key_id(new)
    assert cause_of(before, new_token) == "unknown_key"
    assert cause_of(KeyRing([new]), old_token) == "unknown_key"  # old key removed


def test_agent_headers() -> None:
    ring = KeyRing([new_key()])
    headers = agent_headers(ring, AGENT, SESSION, 600, now=NOW)
    assert set(headers) == {"Authorization", "X-CSF-Agent-ID", "X-CSF-Session-ID"}
    assert headers["X-CSF-Agent-ID"] == AGENT
    assert headers["X-CSF-Session-ID"] == SESSION
    scheme, token = headers["Authorization"].split(" ")
    assert scheme == "Bearer"
    assert ring.verify(token, AGENT, SESSION, now=NOW) == AgentIdentity(AGENT, SESSION, NOW + 600)


def test_error_messages_say_what_to_do() -> None:
    ring = KeyRing([new_key()])
    with pytest.raises(AuthError) as info:
        ring.verify(KeyRing([new_key()]).mint(AGENT, SESSION), AGENT, SESSION)
    assert info.value.code == "unauthorized"
    assert "relay agent-headers" in info.value.message
    assert info.value.details() == {"cause": "unknown_key"}
    assert set(tokens.AUTH_MESSAGES) == set(get_args(tokens.AuthCause))


def test_keyring_repr_hides_keys() -> None:
    key = new_key()
    text = repr(KeyRing([key]))
    assert key_id(key) in text
    assert b64(key) not in text


# --- key files -------------------------------------------------------------------------------------


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_generate_key_shape() -> None:
    key = generate_key()
    assert len(key) == 43
    assert len(base64.urlsafe_b64decode(key + "=")) == 32
    assert generate_key() != key


def test_write_and_load_key_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.key"
    kid = write_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = load_key_file(path)
    assert ring.signing_kid == kid
    with pytest.raises(KeyFileError, match="already exists"):
        write_key_file(path)
    assert load_key_file(path).signing_kid == kid  # untouched
    new_kid = write_key_file(path, force=True)
    assert new_kid != kid
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key_file(path).signing_kid == new_kid
    assert [p.name for p in tmp_path.iterdir()] == ["relay.key"]  # no temp file left


def test_write_key_file_refuses_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        write_key_file(tmp_path / "nope" / "relay.key")
    with pytest.raises(KeyFileError, match="directory"):
        write_key_file(tmp_path, force=True)


def test_key_file_with_comments_and_rotation(tmp_path: Path) -> None:
    new, old = generate_key(), generate_key()
    path = write(tmp_path / "k", f"# rotated today\n\n  {new}  \n# previous\n{old}\n")
    ring = load_key_file(path)
    assert ring.kids == (
        key_id(base64.urlsafe_b64decode(new + "=")),
        key_id(base64.urlsafe_b64decode(old + "=")),
    )
    old_ring = KeyRing([base64.urlsafe_b64decode(old + "=")])
    assert ring.verify(old_ring.mint(AGENT, SESSION, now=NOW), AGENT, SESSION, now=NOW).agent == AGENT


@pytest.mark.parametrize(
    ("text", "mode", "match"),
    [
        ("", 0o600, "is empty"),
        ("\n  \n", 0o600, "is empty"),
        ("# only a comment\n", 0o600, "no key"),
        ("not-a-key\n", 0o600, "line 1: not a key"),
        ("# c\n" + "A" * 42 + "\n", 0o600, "line 2: not a key"),
        ("KEY KEY\n", 0o600, "line 1: not a key"),
        ("KEY\nKEY\n", 0o600, "line 2: repeats"),
        ("KEY # trailing comment\n", 0o600, "line 1: not a key"),
        ("KEY\n", 0o644, r"run `chmod 600 "),
        ("KEY\n", 0o640, r"mode 0640"),
        ("KEY\n", 0o604, r"chmod 600"),
        ("KEY\n", 0o620, r"chmod 600"),
    ],
)
def test_key_file_refusals(tmp_path: Path, text: str, mode: int, match: str) -> None:
    path = write(tmp_path / "k", text.replace("KEY", generate_key()), mode)
    with pytest.raises(KeyFileError, match=match) as info:
        load_key_file(path)
    assert "\n" not in str(info.value)


def test_key_file_missing_or_not_regular(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="relay keygen"):
        load_key_file(tmp_path / "missing")
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_key_file(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_key_file(fifo)


def test_key_file_error_does_not_echo_the_line(tmp_path: Path) -> None:
    secret = generate_key()[:40]
    path = write(tmp_path / "k", secret + "\n")
    with pytest.raises(KeyFileError) as info:
        load_key_file(path)
    assert secret not in str(info.value)


# --- middleware on a real socket -------------------------------------------------------------------


async def inner_app(scope: Scope, receive: Receive, send: Send) -> None:
    identity = scope["state"]["agent"]
    user = scope["user"]
    body = json.dumps(
        {
            "agent": identity.agent,
            "session": identity.session,
            "expires_at": identity.expires_at,
            "identity_type": type(identity).__name__,
            "client_id": user.access_token.client_id,
            "token": user.access_token.token,
            "user_expires_at": user.access_token.expires_at,
            "method": scope["method"],
        }
    ).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


class Server:
    def __init__(self, url: str, keyring: KeyRing, foreign: KeyRing) -> None:
        self.url = url
        self.keyring = keyring
        self.foreign = foreign


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[Server]:
    keyring = KeyRing([new_key()])
    app = Starlette(routes=[Route("/mcp/agent", endpoint=AgentAuthMiddleware(inner_app, keyring))])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    await eventually(lambda: uv.started or task.done(), 5, "uvicorn started")
    assert uv.started, "uvicorn exited at start-up"
    try:
        yield Server(f"http://127.0.0.1:{port}/mcp/agent", keyring, KeyRing([new_key()]))
    finally:
        uv.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_middleware_passes_verified_requests(server: Server) -> None:
    headers = agent_headers(server.keyring, AGENT, SESSION, 600)
    async with httpx2.AsyncClient(timeout=10) as client:
        for method in ("POST", "GET", "DELETE"):
            response = await client.request(method, server.url, headers=headers, content=b"{}")
            assert response.status_code == 200, response.text
            seen = response.json()
            assert seen["agent"] == AGENT
            assert seen["session"] == SESSION
            assert seen["identity_type"] == "AgentIdentity"
            assert seen["client_id"] == f"{AGENT}/{SESSION}"
            assert seen["token"] == "<redacted>"
            assert seen["expires_at"] == seen["user_expires_at"]
            assert seen["method"] == method
        lower = {
            "authorization": "bearer " + headers["Authorization"].split(" ")[1],
            "x-csf-agent-id": AGENT,
            "x-csf-session-id": SESSION,
        }
        assert (await client.post(server.url, headers=lower)).status_code == 200


def _cases(server: Server) -> list[tuple[str, dict[str, str]]]:
    good = agent_headers(server.keyring, AGENT, SESSION, 600)
    token = good["Authorization"].split(" ")[1]

    def without(name: str) -> dict[str, str]:
        return {k: v for k, v in good.items() if k != name}

    return [
        ("missing_authorization", without("Authorization")),
        ("malformed_authorization", {**good, "Authorization": f"Basic {token}"}),
        ("malformed_authorization", {**good, "Authorization": "Bearer"}),
        ("malformed_authorization", {**good, "Authorization": token}),
        ("missing_agent_header", without("X-CSF-Agent-ID")),
        ("missing_session_header", without("X-CSF-Session-ID")),
        ("malformed_token", {**good, "Authorization": "Bearer garbage"}),
        ("malformed_token", {**good, "Authorization": "Bearer " + token[:-3]}),
        ("unsupported_token_version", {**good, "Authorization": "Bearer v2" + token[2:]}),
        ("unknown_key", {**good, "Authorization": "Bearer " + server.foreign.mint(AGENT, SESSION)}),
        (
            "bad_signature",
            {**good, "Authorization": "Bearer " + token[:-2] + ("AA" if token[-2:] != "AA" else "BA")},
        ),
        (
            "expired",
            {
                **good,
                "Authorization": "Bearer " + server.keyring.mint(AGENT, SESSION, 1, now=time.time() - 1000),
            },
        ),
        (
            "not_yet_valid",
            {**good, "Authorization": "Bearer " + server.keyring.mint(AGENT, SESSION, 60, now=2**40)},
        ),
        ("agent_mismatch", {**good, "X-CSF-Agent-ID": "bob"}),
        ("session_mismatch", {**good, "X-CSF-Session-ID": "other"}),
    ]


async def test_middleware_refuses_with_401(server: Server) -> None:
    async with httpx2.AsyncClient(timeout=10) as client:
        for cause, headers in _cases(server):
            response = await client.post(server.url, headers=headers, content=b'{"jsonrpc":"2.0"}')
            assert response.status_code == 401, (cause, response.text)
            assert response.headers["content-type"] == "application/json"
            assert response.headers["www-authenticate"] == (
                f'Bearer realm="relay", error="invalid_token", error_description="{cause}"'
            )
            body = response.json()
            assert body["jsonrpc"] == "2.0"
            assert body["id"] is None
            assert body["error"]["code"] == -32001
            assert body["error"]["data"] == {"cause": cause}
            assert body["error"]["message"].startswith(f"unauthorized: {cause}: ")
            _, _, token = headers.get("Authorization", "").partition(" ")
            if token:
                assert token not in response.text
                assert token.split(".")[-1] not in response.text


async def test_middleware_exact_path_only(server: Server) -> None:
    headers = agent_headers(server.keyring, AGENT, SESSION, 600)
    async with httpx2.AsyncClient(timeout=10) as client:
        response = await client.post(server.url + "/extra", headers=headers)
        assert response.status_code == 404


async def test_middleware_passes_non_http_scopes() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        raise AssertionError("nothing should be sent")

    await AgentAuthMiddleware(app, KeyRing([new_key()]))({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]


async def test_middleware_reuses_the_user_but_checks_expiry_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keyring = KeyRing([new_key()])
    clock = [float(NOW)]
    monkeypatch.setattr(tokens, "time", SimpleNamespace(time=lambda: clock[0]))
    users: list[Any] = []
    sent: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        users.append(scope["user"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = AgentAuthMiddleware(app, keyring)
    headers = [
        (k.lower().encode(), v.encode()) for k, v in agent_headers(keyring, AGENT, SESSION, 600).items()
    ]
    for _ in range(2):
        await middleware({"type": "http", "path": "/mcp/agent", "headers": headers}, receive, send)
    assert len(users) == 2 and users[0] is users[1] and not sent
    assert users[0].access_token.client_id == f"{AGENT}/{SESSION}"
    assert users[0].access_token.expires_at == NOW + 600

    clock[0] = NOW + 600
    await middleware({"type": "http", "path": "/mcp/agent", "headers": headers}, receive, send)
    assert len(users) == 2
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"])["error"]["data"] == {"cause": "expired"}
