"""Hostile input at ``/mcp/agent``: raw HTTP and JSON-RPC bodies, hostile headers, forged identities.

Every response must be a clean error: never a 5xx, never a traceback (in the body or in the server's
log), JSON-RPC shaped when it is JSON. Nothing a refused request carried may be stored, and after
each run every Redis key under the test's prefix must follow ``docs/redis-layout.md`` with an agent id
that the test authenticated as (so no key name is ever derived from hostile input).

The server runs on its own event loop in a thread (``ThreadedFront``), so the checks here, and the
property tests in ``test_properties.py``, can use plain synchronous clients and hypothesis.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.logs import TextFormatter
from tests.fuzz_support import HOSTILE_TEXT, JSON, ErrorLog, assert_layout, error_log
from tests.processes import REGISTER
from tests.rpc_support import (
    HOSTILE_IDS,
    ThreadedFront,
    call,
    clean,
    encode,
    register,
    rpc,
    tool_outcome,
)

__all__ = ["error_log"]  # a fixture, used by name

TOOLS = ("RegisterAgentAddress", "SendAgentMessage", "FetchAgentInbox", "AcknowledgeAgentInbox")


# --- checks ----------------------------------------------------------------------------------------


def stored_envelopes(store: redis.Redis, prefix: str) -> int:
    return sum(int(store.xlen(key)) for key in store.scan_iter(f"{prefix}:inbox:*", count=1000))


# --- the curated corpus ----------------------------------------------------------------------------


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def hostile_bodies(limit: int) -> list[tuple[str, bytes]]:
    """Bodies that must all be refused (none is a valid send). ``limit`` is the body-size limit."""
    good_message = {"kind": 1, "text": "x"}
    cases: list[tuple[str, Any]] = [
        ("empty", b""),
        ("whitespace", b"  \n\t "),
        ("truncated json", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/ca'),
        ("not json", b"hello relay"),
        ("trailing garbage", b'{"jsonrpc":"2.0","id":1,"method":"ping"} trailing'),
        ("single quotes", b"{'jsonrpc': '2.0'}"),
        (
            "NaN literal",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"FetchAgentInbox",'
            b'"arguments":{"limit":NaN}}}',
        ),
        (
            "Infinity literal",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
            b'"FetchAgentInbox","arguments":{"wait_ms":Infinity}}}',
        ),
        ("invalid utf-8 body", b"\xff\xfe\xfd\xfc"),
        (
            "invalid utf-8 in a string",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
            b'"SendAgentMessage","arguments":{"to":"bob","message":{"kind":1,"text":"\xc3\x28"}}}}',
        ),
        (
            "overlong utf-8",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
            b'"SendAgentMessage","arguments":{"to":"bob","message":{"kind":1,"text":"\xc0\xaf"}}}}',
        ),
        (
            "lone surrogate escape in text",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
            b'"SendAgentMessage","arguments":{"to":"bob","message":{"kind":1,"text":"\\ud800"}}}}',
        ),
        (
            "lone surrogate escape in to",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
            b'"SendAgentMessage","arguments":{"to":"\\udfff","message":{"kind":1,"text":"x"}}}}',
        ),
        ("utf-16 body", json.dumps(rpc("ping")).encode("utf-16")),
        ("BOM", b"\xef\xbb\xbf" + json.dumps(rpc("ping")).encode()),
        ("array", []),
        ("batch", [call("SendAgentMessage", {"to": "bob", "message": good_message})] * 2),
        ("number", 42),
        ("string", "tools/call"),
        ("null", None),
        ("no jsonrpc", {"id": 1, "method": "ping"}),
        ("jsonrpc 1.0", {"jsonrpc": "1.0", "id": 1, "method": "ping"}),
        ("method number", {"jsonrpc": "2.0", "id": 1, "method": 7}),
        ("method null", {"jsonrpc": "2.0", "id": 1, "method": None}),
        ("id object", {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}),
        ("id list", {"jsonrpc": "2.0", "id": [1], "method": "ping"}),
        ("id float", {"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
        ("id huge", {"jsonrpc": "2.0", "id": 10**400, "method": "ping"}),
        ("id bool", {"jsonrpc": "2.0", "id": True, "method": "ping"}),
        ("unknown method", rpc("relay/shutdown")),
        ("params list", rpc("tools/call", [1, 2])),
        ("params string", rpc("tools/call", "SendAgentMessage")),
        ("tool name number", rpc("tools/call", {"name": 5, "arguments": {}})),
        ("tool name null", rpc("tools/call", {"name": None})),
        ("tool missing", rpc("tools/call", {"arguments": {}})),
        ("tool unknown", call("DeleteAgentInbox", {})),
        ("tool name with colon", call("SendAgentMessage:admin", {})),
        ("arguments string", call("SendAgentMessage", "to=bob")),
        ("arguments list", call("SendAgentMessage", ["bob", good_message])),
        ("arguments null", call("SendAgentMessage", None)),
        ("send without message", call("SendAgentMessage", {"to": "bob"})),
        ("send without to", call("SendAgentMessage", {"message": good_message})),
        ("send to number", call("SendAgentMessage", {"to": 7, "message": good_message})),
        ("send to list", call("SendAgentMessage", {"to": ["bob"], "message": good_message})),
        ("send to null", call("SendAgentMessage", {"to": None, "message": good_message})),
        ("message string", call("SendAgentMessage", {"to": "bob", "message": "hello"})),
        ("message list", call("SendAgentMessage", {"to": "bob", "message": [1, "x"]})),
        ("kind bool", call("SendAgentMessage", {"to": "bob", "message": {"kind": True, "text": "x"}})),
        ("kind float", call("SendAgentMessage", {"to": "bob", "message": {"kind": 1.5, "text": "x"}})),
        ("kind zero", call("SendAgentMessage", {"to": "bob", "message": {"kind": 0, "text": "x"}})),
        ("kind 99", call("SendAgentMessage", {"to": "bob", "message": {"kind": 99, "text": "x"}})),
        ("kind huge", call("SendAgentMessage", {"to": "bob", "message": {"kind": 10**30, "text": "x"}})),
        ("kind name", call("SendAgentMessage", {"to": "bob", "message": {"kind": "order", "text": "x"}})),
        ("text number", call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": 5}})),
        ("text object", call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": {"$gt": ""}}})),
        ("text empty", call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": ""}})),
        (
            "text too long",
            call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "é" * 40000}}),
        ),
        (
            "reply without in_reply_to",
            call("SendAgentMessage", {"to": "bob", "message": {"kind": 3, "text": "x"}}),
        ),
        (
            "extra message field",
            call("SendAgentMessage", {"to": "bob", "message": {**good_message, "from": "x"}}),
        ),
        (
            "reserved field nonce",
            call("SendAgentMessage", {"to": "bob", "message": {**good_message, "nonce": "x"}}),
        ),
        (
            "reference empty",
            call("SendAgentMessage", {"to": "bob", "message": {**good_message, "reference": ""}}),
        ),
        (
            "reference huge",
            call("SendAgentMessage", {"to": "bob", "message": {**good_message, "reference": "r" * 5000}}),
        ),
        ("unregistered recipient", call("SendAgentMessage", {"to": "nobody", "message": good_message})),
        (
            "deep message",
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"SendAgentMessage",'
            b'"arguments":{"to":"bob","message":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}}",
        ),
        (
            "deep arguments",
            (
                '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"FetchAgentInbox",'
                f'"arguments":{{"limit":{_nested(20000)}}}}}}}'
            ).encode(),
        ),
        ("deep id", ('{"jsonrpc":"2.0","method":"ping","id":' + _nested(100000) + "}").encode()),
        (
            "deep just under the python limit",
            call(
                "SendAgentMessage",
                {
                    "to": "bob",
                    "message": {"kind": 1, "text": "x", "reference": json.loads(_nested(900, '"x"'))},
                },
            ),
        ),
        (
            "wide object",
            call("SendAgentMessage", {"to": "bob", "message": {f"k{i}": i for i in range(8000)}}),
        ),
        ("many arguments", call("FetchAgentInbox", {f"a{i}": i for i in range(8000)})),
        ("fetch limit zero", call("FetchAgentInbox", {"limit": 0})),
        ("fetch limit negative", call("FetchAgentInbox", {"limit": -1})),
        ("fetch limit huge", call("FetchAgentInbox", {"limit": 10**400})),
        ("fetch limit float", call("FetchAgentInbox", {"limit": 1e308})),
        ("fetch limit string", call("FetchAgentInbox", {"limit": "16; FLUSHALL"})),
        ("fetch wait negative", call("FetchAgentInbox", {"wait_ms": -5})),
        ("fetch wait huge float", call("FetchAgentInbox", {"wait_ms": 1e300})),
        ("fetch as another agent", call("FetchAgentInbox", {"agent": "bob"})),
        ("ack not a list", call("AcknowledgeAgentInbox", {"ids": "env_00000000000000000000000000"})),
        ("ack nulls", call("AcknowledgeAgentInbox", {"ids": [None, 1, {}, []]})),
        ("ack too many", call("AcknowledgeAgentInbox", {"ids": ["env_00000000000000000000000000"] * 1025})),
        ("register unknown provider", call("RegisterAgentAddress", {"provider": "root", "endpoint": "x"})),
        (
            "register network tier",
            call("RegisterAgentAddress", {"provider": "remote", "endpoint": "evil.example:443"}),
        ),
        (
            "register relative unix",
            call("RegisterAgentAddress", {"provider": "claudecode", "endpoint": "unix:x"}),
        ),
        (
            "register nul",
            call("RegisterAgentAddress", {"provider": "claudecode", "endpoint": "unix:/tmp/\x00"}),
        ),
        (
            "register huge",
            call("RegisterAgentAddress", {"provider": "claudecode", "endpoint": "unix:/" + "a" * 200000}),
        ),
        (
            "register as another agent",
            call("RegisterAgentAddress", {**REGISTER, "agent": "bob", "endpoint": 1}),
        ),
        (
            "near the body limit",
            call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x" * (limit - 400)}}),
        ),
    ]
    for value in HOSTILE_IDS:
        cases.append((f"to {value[:24]!r}", call("SendAgentMessage", {"to": value, "message": good_message})))
        cases.append((f"ack {value[:24]!r}", call("AcknowledgeAgentInbox", {"ids": [value]})))
        cases.append(
            (
                f"in_reply_to {value[:24]!r}",
                call(
                    "SendAgentMessage",
                    {"to": "bob", "message": {"kind": 3, "text": "x", "in_reply_to": value}},
                ),
            )
        )
        cases.append((f"tool named {value[:24]!r}", call(value, {})))
        cases.append((f"method {value[:24]!r}", rpc(value)))
    return [(name, body if isinstance(body, bytes) else encode(body)) for name, body in cases]


def test_hostile_bodies_get_clean_errors_and_store_nothing(
    threaded: ThreadedFront, store: redis.Redis, error_log: ErrorLog
) -> None:
    with httpx2.Client(timeout=30) as http:
        headers = register(http, threaded, "fuzz-a", "s1")
        register(http, threaded, "bob", "b1")
        before = stored_envelopes(store, threaded.prefix)
        outcomes: dict[str, int] = {}
        for name, body in hostile_bodies(threaded.max_body_bytes):
            response = http.post(threaded.url, content=body, headers=headers)
            outcome, data = tool_outcome(clean(response))
            assert "sent_at" not in data and data.get("envelopes", []) == [], f"{name}: {data}"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        assert stored_envelopes(store, threaded.prefix) == before
        assert outcomes.get("refused", 0) > 50 and outcomes.get("rpc", 0) > 20, outcomes
    assert not error_log.problems(), error_log.problems()
    assert_layout(store, threaded.prefix, {"fuzz-a", "bob"})


def test_hostile_ids_in_headers_never_authenticate(
    threaded: ThreadedFront, store: redis.Redis, error_log: ErrorLog
) -> None:
    """Agent and session ids with ``:``, ``*``, ``{}``, spaces, control bytes and non-ASCII: as header
    bytes next to a valid token, and inside tokens signed with the relay's own key (as a buggy or
    compromised minter would make them). CR and LF cannot be in a header value: HTTP framing ends it."""
    good = threaded.headers("fuzz-h", "s1")
    before = stored_envelopes(store, threaded.prefix)
    signing_key = threaded.keyring._keys[threaded.keyring.signing_kid]  # signature checks must pass
    # (ids of 100 KB are left to the body tests: the HTTP parser's header limit refuses them, and may
    # reset the connection before the client has finished writing)
    small = [v for v in HOSTILE_IDS if len(v) < 4096]
    values = [v.encode("utf-8", "surrogatepass") for v in small if "\r" not in v and "\n" not in v]
    # (surrounding blanks are not part of a header value in HTTP: "fuzz-h " is "fuzz-h")
    values += [b"bob\xff", b"b\x80ob", b"fuzz-h\x7f", b"fuzz-h x", b"fuzz\th", b"fuzz-h\x00", b"fuzz-h\x1b"]
    for raw in values:
        for header in (b"X-CSF-Agent-ID", b"X-CSF-Session-ID"):
            status, reply = _raw_post(threaded, good, {header: raw})
            assert status in (400, 401, 431), (header, raw[:40], status, reply[:300])
            assert b"Traceback" not in reply
    with httpx2.Client(timeout=30) as http:
        # the forger writes real tokens: one for the headers' own ids authenticates
        control = _forge(signing_key, threaded.keyring.signing_kid, "fuzz-h", "s1")
        ping = http.post(
            threaded.url, content=encode(rpc("ping")), headers={**good, "Authorization": f"Bearer {control}"}
        )
        assert ping.status_code == 200, ping.text[:300]
        for value in [*small, "a" * 3500]:  # the last one makes a token over MAX_TOKEN_CHARS
            for agent, session in ((value, "s1"), ("fuzz-h", value)):
                token = _forge(signing_key, threaded.keyring.signing_kid, agent, session)
                response = http.post(
                    threaded.url,
                    content=encode(call("RegisterAgentAddress", REGISTER)),
                    headers={**good, "Authorization": f"Bearer {token}"},
                )
                clean(response)
                assert response.status_code == 401, (value, response.text[:300])
                cause = response.json()["error"]["data"]["cause"]
                assert cause in ("malformed_token", "agent_mismatch", "session_mismatch"), (value, cause)
    assert stored_envelopes(store, threaded.prefix) == before
    assert not error_log.problems(), error_log.problems()
    assert not list(store.scan_iter(f"{threaded.prefix}:*fuzz-h*"))


def test_a_tool_call_without_an_id_is_a_notification_and_never_runs(
    threaded: ThreadedFront, store: redis.Redis, error_log: ErrorLog
) -> None:
    """JSON-RPC without an id is a notification: 202, no result; with ``"id": null`` it is an Invalid
    Request (MCP ids are strings or integers): 400. Either way the tool must not run (a send nobody is
    told about would be a silently stored envelope)."""
    with httpx2.Client(timeout=30) as http:
        headers = register(http, threaded, "fuzz-n", "s1")
        for variant in ("null id", "no id"):
            body = call("SendAgentMessage", {"to": "fuzz-n", "message": {"kind": 1, "text": variant}})
            if variant == "null id":
                body["id"] = None
            else:
                del body["id"]
            response = http.post(threaded.url, content=encode(body), headers=headers)
            if variant == "null id":
                assert response.status_code == 400 and response.json()["error"]["code"] == -32600
            else:
                assert response.status_code == 202 and not response.content, response.text
        # A full request round trip after the notifications: had they run, they would be in the inbox.
        marker = call("SendAgentMessage", {"to": "fuzz-n", "message": {"kind": 1, "text": "marker"}})
        assert (
            tool_outcome(clean(http.post(threaded.url, content=encode(marker), headers=headers)))[0] == "ok"
        )
        fetched = clean(http.post(threaded.url, content=encode(call("FetchAgentInbox", {})), headers=headers))
        outcome, inbox = tool_outcome(fetched)
        assert outcome == "ok" and [e["message"]["text"] for e in inbox["envelopes"]] == ["marker"]
    assert not error_log.problems(), error_log.problems()


def test_hostile_input_cannot_forge_or_flood_log_lines(threaded: ThreadedFront) -> None:
    """With the default text log format, a hostile value must not end a log line early (a forged
    second line) nor make one huge. Checked: relay's own loggers at every level, others at WARNING+."""
    records: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.startswith("relay") or record.levelno >= logging.WARNING:
                records.append(record)

    handler = Capture(logging.DEBUG)
    root = logging.getLogger()
    previous = [(name, logging.getLogger(name).level) for name in ("relay", "relay.front")]
    root.addHandler(handler)
    for name, _ in previous:
        logging.getLogger(name).setLevel(logging.INFO)
    forged = "bob\n2026-11-29 13:37:00,000 INFO relay.front: sent envelope=env_X from=alice to=bob"
    try:
        with httpx2.Client(timeout=30) as http:
            headers = register(http, threaded, "fuzz-log", "s1")
            for to in [forged, "\r\n".join(["x"] * 50), "a" * 200_000, "\x1b[31mred\x1b[0m", "\u2028bob"]:
                body = call("SendAgentMessage", {"to": to, "message": {"kind": 1, "text": "x"}})
                outcome, error = tool_outcome(
                    clean(http.post(threaded.url, content=encode(body), headers=headers))
                )
                assert outcome == "refused" and error["code"] == "invalid_argument"
    finally:
        root.removeHandler(handler)
        for name, level in previous:
            logging.getLogger(name).setLevel(level)
    lines = [TextFormatter().format(r) for r in records if not r.exc_info]
    assert any("send refused" in line for line in lines), lines
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line, line[
            :300
        ]
        assert len(line) < 1000, line[:300]


def _forge(key: bytes, kid: str, agent: str, session: str) -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

    header = b64(json.dumps({"alg": "HS256", "kid": kid, "typ": "JWT"}).encode())
    claims = {"agent": agent, "session": session, "iat": 1, "exp": 4_000_000_000}
    signing_input = f"{header}.{b64(json.dumps(claims, ensure_ascii=False).encode('utf-8', 'surrogatepass'))}"
    sig = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"v1.{signing_input}.{b64(sig)}"


def _raw_post(
    threaded: ThreadedFront, headers: dict[str, str], replace: dict[bytes, bytes]
) -> tuple[int, bytes]:
    """POST with header bytes no HTTP client library would send (non-ASCII, DEL, padding)."""
    host, port = threaded.base.removeprefix("http://").split(":")
    body = encode(call("RegisterAgentAddress", REGISTER))
    lines = [
        b"POST /mcp/agent HTTP/1.1",
        f"Host: {host}:{port}".encode(),
        b"Connection: close",
        f"Content-Length: {len(body)}".encode(),
    ]
    for name, value in headers.items():
        raw_name = name.encode("ascii")
        lines.append(raw_name + b": " + replace.get(raw_name, value.encode("latin-1")))
    request = b"\r\n".join(lines) + b"\r\n\r\n" + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    reply = b"".join(chunks)
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return status, reply


# --- generated bodies ------------------------------------------------------------------------------

MESSAGE = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {
            "kind": st.one_of(st.integers(-3, 6), st.sampled_from(["note", "reply", "x", ""]), JSON),
            "text": st.one_of(st.text(max_size=20), JSON),
        },
        optional={
            "in_reply_to": st.one_of(HOSTILE_TEXT, JSON),
            "reference": st.one_of(HOSTILE_TEXT, JSON),
            "extra": JSON,
        },
    ),
)
ARGUMENTS = {
    "RegisterAgentAddress": st.fixed_dictionaries(
        {},
        optional={
            "provider": st.one_of(st.just("claudecode"), HOSTILE_TEXT, JSON),
            "endpoint": st.one_of(
                st.sampled_from(["127.0.0.1:1", "unix:/tmp/x", "[::1]:9"]), HOSTILE_TEXT, JSON
            ),
            "agent": HOSTILE_TEXT,
        },
    ),
    "SendAgentMessage": st.fixed_dictionaries(
        {}, optional={"to": st.one_of(HOSTILE_TEXT, JSON), "message": MESSAGE, "from": HOSTILE_TEXT}
    ),
    "FetchAgentInbox": st.fixed_dictionaries(
        {},
        optional={
            "limit": st.one_of(st.integers(-2, 300), JSON),
            "wait_ms": st.one_of(st.integers(-5, 5), JSON),
            "agent": HOSTILE_TEXT,
        },
    ),
    "AcknowledgeAgentInbox": st.fixed_dictionaries(
        {}, optional={"ids": st.one_of(st.lists(HOSTILE_TEXT, max_size=4), JSON)}
    ),
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A request body and extra headers: mostly near-valid JSON-RPC, some raw bytes."""
    shape = draw(st.sampled_from(["tool"] * 8 + ["rpc", "raw", "json"]))
    if shape == "tool":
        name = draw(st.sampled_from([*TOOLS, *TOOLS, *TOOLS, "other"]))
        if name == "other":
            name = draw(HOSTILE_TEXT)
        arguments = draw(ARGUMENTS[name]) if name in ARGUMENTS else draw(JSON)
        body: Any = call(name, arguments)
        if draw(st.integers(0, 7)) == 0:
            body["id"] = draw(JSON)
    elif shape == "rpc":
        body = {
            "jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0"])),
            "id": draw(JSON),
            "method": draw(
                st.one_of(
                    st.sampled_from(
                        [
                            "ping",
                            "tools/list",
                            "initialize",
                            "tools/call",
                            "notifications/initialized",
                            "server/discover",
                        ]
                    ),
                    HOSTILE_TEXT,
                )
            ),
            "params": draw(JSON),
        }
    elif shape == "json":
        body = draw(JSON)
    else:
        return draw(st.binary(max_size=200)), {}
    extra: dict[str, str] = {}
    era = draw(st.sampled_from(["2025-11-25"] * 6 + ["2026-07-28", "1999-01-01", "x"]))
    extra["mcp-protocol-version"] = era
    if era == "2026-07-28" and draw(st.booleans()):
        extra["mcp-method"] = draw(st.sampled_from(["tools/call", "tools/list", "x"]))
        if isinstance(body, dict):
            params: dict[str, Any] = body["params"] if isinstance(body.get("params"), dict) else {}
            body["params"] = {
                **params,
                "_meta": draw(
                    st.one_of(
                        JSON,
                        st.just(
                            {
                                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "0"},
                                "io.modelcontextprotocol/clientCapabilities": {},
                            }
                        ),
                    )
                ),
            }
    return encode(body), extra


class GeneratedRun:
    def __init__(self) -> None:
        self.sent = 0
        self.refused = 0
        self.other = 0
        self.statuses: Counter[int] = Counter()


@pytest.mark.slow
def test_generated_bodies_get_clean_errors_and_store_only_accepted_sends(
    threaded: ThreadedFront, store: redis.Redis, error_log: ErrorLog
) -> None:
    http = httpx2.Client(timeout=30)
    headers = register(http, threaded, "fuzz-r", "s1")
    register(http, threaded, "bob", "b1")
    # One pending envelope of its own: a generated long-poll (wait_ms) then answers at once.
    sent = http.post(
        threaded.url,
        content=encode(call("SendAgentMessage", {"to": "fuzz-r", "message": {"kind": 1, "text": "keep"}})),
        headers=headers,
    )
    assert tool_outcome(clean(sent))[0] == "ok"
    fetched = http.post(threaded.url, content=encode(call("FetchAgentInbox", {})), headers=headers)
    assert tool_outcome(clean(fetched))[0] == "ok"
    run = GeneratedRun()

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies())
    def check(case: tuple[bytes, dict[str, str]]) -> None:
        body, extra = case
        before = stored_envelopes(store, threaded.prefix)
        response = http.post(threaded.url, content=body, headers={**headers, **extra})
        outcome, data = tool_outcome(clean(response))
        after = stored_envelopes(store, threaded.prefix)
        run.statuses[response.status_code] += 1
        if outcome == "ok" and "sent_at" in data:
            run.sent += 1
            assert after == before + 1, data
        else:
            run.refused += outcome == "refused"
            run.other += outcome != "refused"
            # a fetch/ack by the fuzzing agent may take envelopes out, nothing else changes the count
            assert after <= before, (body[:300], data)

    try:
        check()
    finally:
        http.close()
    print(
        f"\nfuzz: {run.sent} accepted sends, {run.refused} tool refusals, {run.other} other answers; "
        f"HTTP statuses {dict(sorted(run.statuses.items()))}"
    )
    assert run.refused > 50 and run.other > 20
    assert not error_log.problems(), error_log.problems()
    assert_layout(store, threaded.prefix, {"fuzz-r", "bob", "fuzz-a", "fuzz-h", "fuzz-n", "fuzz-log"})


def test_bodies_over_the_limit_get_413_even_without_a_length(
    threaded: ThreadedFront, error_log: ErrorLog
) -> None:
    limit = threaded.max_body_bytes
    headers = threaded.headers("fuzz-l", "s1")
    big = encode(call("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x" * (limit + 1)}}))

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 16384):
            yield big[start : start + 16384]

    with httpx2.Client(timeout=30) as http:
        assert http.post(threaded.url, content=big, headers=headers).status_code == 413
        streamed = http.post(threaded.url, content=chunks(), headers=headers)
        assert streamed.status_code == 413, streamed.text[:300]
        clean(streamed)
        assert http.post(threaded.url, content=b"[" * (limit + 1), headers=headers).status_code == 413
    status, reply = _raw_post_length(threaded, headers, declared=limit + 1, actual=10)
    assert status == 413, reply[:300]
    assert not error_log.problems(), error_log.problems()


def _raw_post_length(
    threaded: ThreadedFront, headers: dict[str, str], *, declared: int, actual: int
) -> tuple[int, bytes]:
    """A Content-Length that promises more than is sent: refused on the declaration alone."""
    host, port = threaded.base.removeprefix("http://").split(":")
    lines = [
        b"POST /mcp/agent HTTP/1.1",
        f"Host: {host}:{port}".encode(),
        b"Connection: close",
        f"Content-Length: {declared}".encode(),
    ]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + b"x" * actual)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        for _ in range(1000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return (int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0), reply
