"""Property-based tests (hypothesis) on the contract, the identifiers, and every tool's arguments.

``tests/test_contract.py`` already checks that valid and arbitrary messages survive both encodings.
Here: the contract and the identifier checks are total (any input: a value or a clean refusal, never
another exception); a relay stores a message exactly when the contract accepts it, and stores it
exactly as sent; and each of the four MCP tools, called over real HTTP with generated arguments,
does what an independent oracle says — and when it refuses, nothing changed in Redis.

Runs are derandomized (the same examples every run) so CI is deterministic.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import redis
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from adapters.redis.keys import Keys
from broker import schemas
from broker.addresses import ClaudeCodeAddress, host_providers
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.errors import ContractViolation, InvalidArgument, RelayError
from broker.front.http_limits import DEFAULT_MAX_BODY_BYTES
from broker.ids import (
    AGENT_ID_PATTERN,
    ENVELOPE_ID_PATTERN,
    SESSION_ID_PATTERN,
    check_agent_id,
    check_session_id,
    decode_envelope_id,
    encode_envelope_id,
    is_envelope_id,
)
from tests.rpc_support import (
    HOSTILE_IDS,
    ThreadedFront,
    call,
    clean,
    encode,
    register,
    tool_outcome,
)
from tests.support import memory_relays

CONTRACT = AgentMessageContract()
SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
KIND_NAMES = ("note", "request", "reply", "status")
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30)  # JSON-encodable
ENVELOPE_IDS = st.from_regex(ENVELOPE_ID_PATTERN, fullmatch=True)
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), TEXT
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)


# --- messages --------------------------------------------------------------------------------------

KINDS = st.one_of(
    st.integers(-2, 6),
    st.sampled_from([*KIND_NAMES, "NOTE", "kind_reply", "KIND_STATUS", "order", "", "1"]),
    st.sampled_from([True, False, 1.0, 2**31, -(2**31) - 1, None]),
)
NON_EMPTY = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30)
VALID_MESSAGES = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.sampled_from([1, 2, 4, "note", "request", "status"]), "text": NON_EMPTY},
        optional={"reference": NON_EMPTY, "in_reply_to": st.one_of(st.none(), ENVELOPE_IDS)},
    ),
    st.fixed_dictionaries(
        {"kind": st.sampled_from([3, "reply"]), "text": NON_EMPTY, "in_reply_to": ENVELOPE_IDS}
    ),
)
MESSAGES = st.one_of(
    VALID_MESSAGES,
    st.fixed_dictionaries(
        {
            "kind": KINDS,
            "text": st.one_of(TEXT, st.sampled_from(["", " ", "x" * 65536, "é" * 32768, "é" * 32769])),
        },
        optional={
            "in_reply_to": st.one_of(st.none(), ENVELOPE_IDS, TEXT),
            "reference": st.one_of(st.none(), TEXT, st.just("r" * 2048), st.just("r" * 2049)),
            "extra": JSON,
        },
    ),
    JSON,
)


def contract_accepts(data: object) -> AgentMessage | None:
    """The oracle: the message the contract makes of ``data``, or None when it refuses."""
    try:
        body = CONTRACT.from_json(data)
        CONTRACT.validate(body)
    except ContractViolation as exc:
        assert exc.violations, "a refusal names at least one violation"
        for violation in exc.violations:
            assert isinstance(violation.field, str) and violation.rule and violation.message
        return None
    return body


@SETTINGS
@given(MESSAGES)
def test_the_contract_is_total_and_its_refusals_name_the_rules(data: object) -> None:
    body = contract_accepts(data)
    event("accepted" if body is not None else "refused")
    if body is not None:
        assert CONTRACT.from_json(json.loads(json.dumps(CONTRACT.to_json(body)))) == body
        assert CONTRACT.from_fields(CONTRACT.to_fields(body)) == body


@SETTINGS
@given(st.lists(MESSAGES, min_size=1, max_size=5))
def test_a_relay_stores_exactly_what_the_contract_accepts(batch: list[object]) -> None:
    async def run() -> None:
        async with memory_relays(CONTRACT, 1) as (relay,):
            await relay.register("alice", ClaudeCodeAddress.parse("127.0.0.1:1"), "s")
            expected = []
            for data in batch:
                body = contract_accepts(data)
                try:
                    message = CONTRACT.from_json(data)
                    sent = await relay.send("alice", "alice", message)
                except RelayError as exc:
                    assert body is None and exc.code == "contract_violation", (data, exc)
                    continue
                assert body is not None and sent.message == body
                expected.append((sent.id, body))
            got = await relay.fetch("alice", 256)
            assert [(e.id, e.message) for e in got] == expected

    asyncio.run(run())


# --- identifiers -------------------------------------------------------------------------------------

IDS = st.one_of(TEXT, st.sampled_from(HOSTILE_IDS), st.from_regex(AGENT_ID_PATTERN, fullmatch=True))


@SETTINGS
@given(IDS)
def test_agent_ids_are_accepted_exactly_by_their_pattern_and_never_inject_into_keys(value: str) -> None:
    matches = re.fullmatch(AGENT_ID_PATTERN, value) is not None
    try:
        check_agent_id(value, "to")
    except InvalidArgument as exc:
        assert not matches and exc.violation.field == "to" and exc.violation.rule == "agent_id.pattern"
        assert len(exc.message) < 400  # a hostile 100 KB id is not echoed back whole
        return
    assert matches
    assert not set(value) & set(":{}*?[]\\ \t\r\n\"'") and value.isascii() and value == value.lower()
    keys = Keys("p")
    for key in (keys.inbox(value), keys.registration(value), keys.rate(value), keys.dead_letters(value)):
        assert re.fullmatch(r"p:(inbox|agent|rate|dead):\{([^{}]+)\}", key).group(2) == value  # type: ignore[union-attr]


@SETTINGS
@given(IDS)
def test_session_ids_are_accepted_exactly_by_their_pattern(value: str) -> None:
    matches = re.fullmatch(SESSION_ID_PATTERN, value) is not None
    try:
        check_session_id(value)
    except InvalidArgument:
        assert not matches
        return
    assert matches


@SETTINGS
@given(
    st.integers(0, 32**10 - 1),
    st.integers(0, 32**6 - 1),
    st.from_regex(r"[0-9A-HJKMNP-TV-Z]{10}", fullmatch=True),
)
def test_envelope_ids_round_trip(ms: int, seq: int, nonce: str) -> None:
    envelope_id = encode_envelope_id(ms, seq, nonce)
    assert is_envelope_id(envelope_id) and decode_envelope_id(envelope_id) == (ms, seq, nonce)


@SETTINGS
@given(st.one_of(IDS, ENVELOPE_IDS, JSON))
def test_is_envelope_id_is_its_pattern(value: object) -> None:
    assert is_envelope_id(value) == (
        isinstance(value, str) and re.fullmatch(ENVELOPE_ID_PATTERN, value) is not None
    )


# --- the four tools over HTTP --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=30) as client:
        yield client


def run_tool(
    http: httpx2.Client, threaded: ThreadedFront, headers: dict[str, str], name: str, arguments: Any
) -> tuple[str, dict[str, Any]]:
    return tool_outcome(
        clean(http.post(threaded.url, content=encode(call(name, arguments)), headers=headers))
    )


def with_mail(
    http: httpx2.Client,
    threaded: ThreadedFront,
    store: redis.Redis,
    agent: str,
    sender: str,
    *,
    at_least: int,
    send: int,
) -> tuple[dict[str, str], dict[str, str], Keys]:
    """Register ``agent`` and ``sender``; when ``agent``'s inbox holds fewer than ``at_least``
    envelopes, ``sender`` sends it ``send`` more. Returns both agents' headers and the keys."""
    me = register(http, threaded, agent, "s1")
    other = register(http, threaded, sender, "s1")
    keys = Keys(threaded.prefix)
    if store.xlen(keys.inbox(agent)) < at_least:
        for i in range(send):
            message = {"to": agent, "message": {"kind": 1, "text": f"#{i}"}}
            assert run_tool(http, threaded, other, "SendAgentMessage", message)[0] == "ok"
    return me, other, keys


def tool_accepts_message(data: object) -> AgentMessage | None:
    """The front reads a message exactly as the contract does (its JSON reading, then its rules)."""
    return contract_accepts(data)


RECIPIENTS = st.one_of(st.sampled_from(["bob", "prop"]), st.just("nobody"), IDS, JSON)


@SETTINGS
@given(to=RECIPIENTS, message=MESSAGES)
@example(to="bob", message={"kind": "request", "text": "review?", "reference": "https://x/1"})
@example(to="prop", message={"kind": 3, "text": "ok", "in_reply_to": "env_" + "0" * 26})
def test_send_stores_one_envelope_exactly_when_the_oracle_accepts(
    threaded: ThreadedFront, store: redis.Redis, http: httpx2.Client, to: object, message: object
) -> None:
    headers = register(http, threaded, "prop", "s1")
    register(http, threaded, "bob", "b1")
    keys = Keys(threaded.prefix)
    lengths = {agent: store.xlen(keys.inbox(agent)) for agent in ("prop", "bob")}
    outcome, data = run_tool(http, threaded, headers, "SendAgentMessage", {"to": to, "message": message})
    body = tool_accepts_message(message)
    expected_ok = body is not None and to in ("bob", "prop")
    event(f"send {outcome} {data.get('code', '')}")
    assert (outcome == "ok") == expected_ok, (to, message, outcome, data)
    after = {agent: store.xlen(keys.inbox(agent)) for agent in ("prop", "bob")}
    if outcome != "ok":
        assert outcome == "refused" and after == lengths, (outcome, data)
        assert data["code"] in {"contract_violation", "invalid_argument", "unknown_recipient"}
        assert not store.exists(keys.inbox("nobody"))
        return
    assert body is not None and isinstance(to, str)
    assert after == {**lengths, to: lengths[to] + 1}
    assert data["to"] == to and data["tier"] == "host"
    newest: list[tuple[str, dict[str, str]]] = store.xrevrange(keys.inbox(to), count=1)  # type: ignore[assignment]
    ((_entry_id, fields),) = newest
    assert fields["from"] == "prop"
    assert {
        k: v for k, v in fields.items() if k not in {"from", "tier", "sent_at", "nonce"}
    } == CONTRACT.to_fields(body)
    assert data["id"].endswith(fields["nonce"])


ENDPOINTS = st.one_of(
    st.sampled_from(["127.0.0.1:1", "127.9.9.9:65535", "[::1]:8080", "localhost:1", "unix:/tmp/a.sock"]),
    st.sampled_from(
        [
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "10.0.0.1:80",
            "example.com:80",
            "unix:tmp",
            "unix:/",
            "unix:/" + "a" * 110,
            "session-1",
            "https://agents.example.net",
            "",
        ]
    ),
    st.builds(lambda port: f"127.0.0.1:{port}", st.integers(-1, 70000)),
    TEXT,
    JSON,
)
PROVIDERS = st.one_of(
    st.just("claudecode"), st.sampled_from(["workbench", "remote", "Claudecode", ""]), TEXT, JSON
)


@SETTINGS
@given(provider=PROVIDERS, endpoint=ENDPOINTS)
@example(provider="claudecode", endpoint="unix:/tmp/relay-prop.sock")
def test_register_accepts_exactly_host_tier_addresses(
    threaded: ThreadedFront, store: redis.Redis, http: httpx2.Client, provider: object, endpoint: object
) -> None:
    headers = register(http, threaded, "prop-reg", "s1")
    key = Keys(threaded.prefix).registration("prop-reg")
    before = store.hgetall(key)
    outcome, data = run_tool(
        http, threaded, headers, "RegisterAgentAddress", {"provider": provider, "endpoint": endpoint}
    )
    try:
        address = (
            host_providers().parse(provider, endpoint)
            if isinstance(provider, str) and isinstance(endpoint, str)
            else None
        )
    except InvalidArgument:
        address = None
    event(f"register {outcome} {data.get('code', '')}")
    assert (outcome == "ok") == (address is not None), (provider, endpoint, data)
    after = store.hgetall(key)
    if address is None:
        assert data["code"] in {"invalid_address", "invalid_argument"} and after == before
        return
    assert data["tier"] == "host" and data["endpoint"] == endpoint and data["agent"] == "prop-reg"
    assert after["endpoint"] == endpoint and after["provider"] == provider and after["session"] == "s1"
    assert after["registered_at"] == before["registered_at"]


LIMITS = st.one_of(st.integers(-3, 300), st.sampled_from([2**63, -(2**63)]))
WAITS = st.integers(-3, 30)
OTHER_TYPES = st.one_of(
    st.booleans(), st.floats(allow_nan=False), TEXT, st.lists(st.integers(), max_size=2), st.none()
)


@SETTINGS
@given(
    arguments=st.fixed_dictionaries(
        {}, optional={"limit": st.one_of(LIMITS, OTHER_TYPES), "wait_ms": st.one_of(WAITS, OTHER_TYPES)}
    )
)
def test_fetch_returns_at_most_limit_of_the_callers_own_envelopes_oldest_first(
    threaded: ThreadedFront, store: redis.Redis, http: httpx2.Client, arguments: dict[str, Any]
) -> None:
    me, _other, keys = with_mail(http, threaded, store, "prop-fetch", "prop-other", at_least=5, send=10)
    entries: list[tuple[str, dict[str, str]]] = store.xrange(keys.inbox("prop-fetch"))  # type: ignore[assignment]
    stored = [entry_id for entry_id, _ in entries]
    before = store.xlen(keys.inbox("prop-fetch"))
    outcome, data = run_tool(http, threaded, me, "FetchAgentInbox", arguments)
    event(f"fetch {outcome} {data.get('code', '')}")
    # the published schema is the oracle: what it allows is fetched (null is absent, 1.0 is 1)
    allowed = not list(Draft202012Validator(schemas.FETCH_ARGUMENTS).iter_errors(arguments))
    assert (outcome == "ok") == allowed, (arguments, data)
    limit = 16 if arguments.get("limit") is None else arguments["limit"]
    assert store.xlen(keys.inbox("prop-fetch")) == before  # fetching never removes anything
    if outcome != "ok":
        assert data["code"] == "invalid_argument", data
        return
    envelopes = data["envelopes"]
    assert 0 < len(envelopes) <= min(int(limit), 256)
    positions = [decode_envelope_id(e["id"])[:2] for e in envelopes]
    assert (
        positions == sorted(positions)
        and [f"{ms}-{seq}" for ms, seq in positions] == stored[: len(envelopes)]
    )
    assert all(e["from"] == "prop-other" and e["deliveries"] >= 1 for e in envelopes)


@SETTINGS
@given(data=st.data())
def test_acknowledge_removes_exactly_the_callers_delivered_envelopes(
    threaded: ThreadedFront, store: redis.Redis, http: httpx2.Client, data: st.DataObject
) -> None:
    me, other, keys = with_mail(http, threaded, store, "prop-ack", "prop-sender", at_least=4, send=8)
    outcome, fetched = run_tool(http, threaded, me, "FetchAgentInbox", {"limit": 4})
    assert outcome == "ok"
    delivered = [e["id"] for e in fetched["envelopes"]]
    # ids of the sender's own sends to itself are real ids, but not prop-ack's
    outcome, foreign = run_tool(
        http, threaded, other, "SendAgentMessage", {"to": "prop-sender", "message": {"kind": 1, "text": "x"}}
    )
    assert outcome == "ok"
    forged = [i[:-1] + ("0" if i[-1] != "0" else "1") for i in delivered]
    candidates = st.one_of(st.sampled_from([*delivered, foreign["id"], *forged]), ENVELOPE_IDS, IDS)
    ids = data.draw(
        st.one_of(st.lists(candidates, max_size=8), st.lists(candidates, min_size=1025, max_size=1025), JSON)
    )
    before = store.xlen(keys.inbox("prop-ack"))
    outcome, done = run_tool(http, threaded, me, "AcknowledgeAgentInbox", {"ids": ids})
    event(f"ack {outcome} {done.get('code', '')} acknowledged={bool(done.get('acknowledged'))}")
    well_formed = isinstance(ids, list) and all(isinstance(i, str) for i in ids)
    if well_formed:
        assert (outcome == "ok") == (len(ids) <= 1024 and all(is_envelope_id(i) for i in ids)), (ids, done)
    if outcome == "rpc":  # refused before any tool ran: only a body over the size limit may be
        assert len(encode(call("AcknowledgeAgentInbox", {"ids": ids}))) > DEFAULT_MAX_BODY_BYTES
        assert store.xlen(keys.inbox("prop-ack")) == before
        return
    if outcome != "ok":
        assert done["code"] == "invalid_argument", done
        assert store.xlen(keys.inbox("prop-ack")) == before
        return
    unique = list(dict.fromkeys(ids))
    assert done["acknowledged"] == [i for i in unique if i in delivered]
    assert done["unknown"] == [i for i in unique if i not in delivered]
    assert store.xlen(keys.inbox("prop-ack")) == before - len(done["acknowledged"])
    outcome, again = run_tool(http, threaded, me, "FetchAgentInbox", {"limit": 256})
    assert outcome == "ok" and not {e["id"] for e in again["envelopes"]} & set(done["acknowledged"])
    ms, seq, _ = decode_envelope_id(foreign["id"])
    assert store.xrange(keys.inbox("prop-sender"), f"{ms}-{seq}", f"{ms}-{seq}")  # still there, untouched
