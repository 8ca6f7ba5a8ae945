"""Credentials over the real MCP endpoint: no agent acts as another, and refused requests change nothing.

Already covered elsewhere (not repeated here):

* ``tests/test_auth.py``: token format; malformed shapes and payloads; signed but malformed claims;
  tampered signatures and payloads; foreign keys; expiry and clock skew; header mismatch; rotation at
  the key-ring level; key files (modes 0644/0640/0604/0620, missing, not regular, empty, comments,
  duplicates); the middleware's 401 on a real socket.
* ``tests/test_front_mcp.py::test_every_authentication_failure_is_a_401_naming_its_cause``: missing
  headers, malformed, tampered, half-truncated, expired and foreign-key tokens, and agent/session
  mismatch, over HTTP. ``test_superseded_session_is_told_to_register_again`` (fetch only) and
  ``test_an_agent_cannot_acknowledge_another_agents_envelopes`` (ack by the sender's own ids).
* ``tests/test_serve.py::test_bad_key_files_are_refused_with_one_line``: loose, missing and empty key
  files at ``relay serve``.

Added here: one agent's token with another agent's id on every tool, with the state checked unchanged;
swapped and duplicated identity headers; every truncation of a token; tokens cut and pasted from two
agents; tool arguments that name another agent; fetch and acknowledge of another agent's envelopes,
by a third agent, by the sender and with forged nonces; a superseded session on every tool; key
rotation over HTTP; key files reached through a symlink.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis.asyncio as aioredis

from adapters.redis.keys import GROUP, Keys
from broker.front.app import create_app
from broker.front.key_file import KeyFileError, load_key_file
from broker.front.tokens import KeyRing, agent_headers, generate_key
from tests.front_support import Front, running_front, serve_app
from tests.processes import MCP_HEADERS, REGISTER, structured, tool_call_body, tool_result
from tests.support import unique_prefix

TOOL_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("RegisterAgentAddress", {"provider": "claudecode", "endpoint": "unix:/tmp/mallory.sock"}),
    ("SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "forged"}}),
    ("FetchAgentInbox", {"limit": 16}),
    ("AcknowledgeAgentInbox", {"ids": ["env_00000000000000000000000000"]}),
    ("ListAgents", {}),
    ("SearchAgentMessages", {}),
]


class World:
    """A running front, its Redis keys, and an HTTP client that posts raw JSON-RPC."""

    def __init__(self, front: Front, store: aioredis.Redis, prefix: str, http: httpx2.AsyncClient) -> None:
        self.front = front
        self.store = store
        self.keys = Keys(prefix)
        self.http = http

    def headers(self, agent: str, session: str) -> dict[str, str]:
        return self.front.headers(agent, session)

    async def post(
        self, headers: dict[str, str] | list[tuple[str, str]], name: str, arguments: dict[str, Any]
    ) -> httpx2.Response:
        body = json.dumps(tool_call_body(name, arguments))
        extra = list(headers.items()) if isinstance(headers, dict) else list(headers)
        return await self.http.post(self.front.url, content=body, headers=[*MCP_HEADERS.items(), *extra])

    async def ok(self, headers: dict[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return structured(tool_result(await self.post(headers, name, arguments)))

    async def refused(self, headers: dict[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = tool_result(await self.post(headers, name, arguments))
        assert result.get("isError"), result
        return dict(json.loads(result["content"][0]["text"])["error"])

    async def unauthorized(
        self, headers: dict[str, str] | list[tuple[str, str]], name: str, arguments: dict[str, Any]
    ) -> str:
        response = await self.post(headers, name, arguments)
        assert response.status_code == 401, response.text
        body = response.json()
        assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32001
        return str(body["error"]["data"]["cause"])

    async def snapshot(self, *agents: str) -> dict[str, Any]:
        """Everything an agent's keys hold (but its last-seen time), with the delivery count of every
        pending entry."""
        state: dict[str, Any] = {}
        for agent in agents:
            inbox = self.keys.inbox(agent)
            pending = (
                await self.store.xpending_range(inbox, GROUP, "-", "+", 1000)
                if await self.store.exists(inbox)
                else []
            )
            registration = await self.store.hgetall(self.keys.registration(agent))
            registration.pop("seen_at", None)  # the agent's own calls move it: a heartbeat, not state
            state[agent] = {
                "registration": registration,
                "entries": await self.store.xrange(inbox) if await self.store.exists(inbox) else [],
                "pending": sorted((p["message_id"], p["times_delivered"]) for p in pending),
            }
        state["agents"] = sorted([k async for k in self.store.scan_iter(match=self.keys.registrations())])
        return state


@pytest.fixture
async def world(redis_url: str) -> AsyncIterator[World]:
    prefix = unique_prefix()
    store = aioredis.Redis.from_url(redis_url, decode_responses=True)
    async with (
        running_front(redis_url, prefix=prefix) as front,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        try:
            yield World(front, store, prefix, http)
        finally:
            await store.aclose()


async def _alice_with_mail(world: World) -> tuple[dict[str, str], dict[str, str], dict[str, str], list[str]]:
    """alice, bob and mallory registered; bob sent alice two notes, alice fetched them once."""
    alice, bob, mallory = (
        world.headers("alice", "a-1"),
        world.headers("bob", "b-1"),
        world.headers("mallory", "m-1"),
    )
    for headers in (alice, bob, mallory):
        await world.ok(headers, "RegisterAgentAddress", REGISTER)
    ids = [
        (
            await world.ok(
                bob, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": f"for alice {i}"}}
            )
        )["id"]
        for i in range(2)
    ]
    got = await world.ok(alice, "FetchAgentInbox", {})
    assert [e["id"] for e in got["envelopes"]] == ids
    return alice, bob, mallory, ids


async def test_one_agents_token_with_another_agents_id_changes_nothing(world: World) -> None:
    alice, _bob, mallory, _ids = await _alice_with_mail(world)
    before = await world.snapshot("alice", "mallory")
    token = mallory["Authorization"]
    impersonations = [
        {"Authorization": token, "X-CSF-Agent-ID": "alice", "X-CSF-Session-ID": "m-1"},
        {"Authorization": token, "X-CSF-Agent-ID": "alice", "X-CSF-Session-ID": "a-1"},
        {**alice, "Authorization": token},
    ]
    for headers in impersonations:
        for name, arguments in TOOL_CALLS:
            assert await world.unauthorized(headers, name, arguments) == "agent_mismatch", (headers, name)
    assert await world.snapshot("alice", "mallory") == before


async def test_swapped_and_duplicated_identity_headers_are_refused(world: World) -> None:
    alice, _bob, mallory, _ids = await _alice_with_mail(world)
    alice_2 = world.headers("alice", "a-2")
    before = await world.snapshot("alice", "bob", "mallory")
    cases: list[tuple[list[tuple[str, str]], str]] = [
        # alice's token with bob's identity headers, in every combination
        (
            [
                ("Authorization", alice["Authorization"]),
                ("X-CSF-Agent-ID", "bob"),
                ("X-CSF-Session-ID", "b-1"),
            ],
            "agent_mismatch",
        ),
        (
            [
                ("Authorization", alice["Authorization"]),
                ("X-CSF-Agent-ID", "alice"),
                ("X-CSF-Session-ID", "b-1"),
            ],
            "session_mismatch",
        ),
        (
            [
                ("Authorization", alice["Authorization"]),
                ("X-CSF-Agent-ID", "bob"),
                ("X-CSF-Session-ID", "a-1"),
            ],
            "agent_mismatch",
        ),
        # the agent and session headers swapped with each other
        (
            [
                ("Authorization", alice["Authorization"]),
                ("X-CSF-Agent-ID", "a-1"),
                ("X-CSF-Session-ID", "alice"),
            ],
            "agent_mismatch",
        ),
        # alice's token of session a-2 sent with session a-1 (and the reverse)
        (
            [
                ("Authorization", alice_2["Authorization"]),
                ("X-CSF-Agent-ID", "alice"),
                ("X-CSF-Session-ID", "a-1"),
            ],
            "session_mismatch",
        ),
        (
            [
                ("Authorization", alice["Authorization"]),
                ("X-CSF-Agent-ID", "alice"),
                ("X-CSF-Session-ID", "a-2"),
            ],
            "session_mismatch",
        ),
        # duplicated headers: the first of each is the one checked, so a second cannot switch identity
        (
            [
                ("Authorization", mallory["Authorization"]),
                ("X-CSF-Agent-ID", "alice"),
                ("X-CSF-Agent-ID", "mallory"),
                ("X-CSF-Session-ID", "m-1"),
            ],
            "agent_mismatch",
        ),
        (
            [
                ("Authorization", alice["Authorization"]),
                ("Authorization", mallory["Authorization"]),
                ("X-CSF-Agent-ID", "mallory"),
                ("X-CSF-Session-ID", "m-1"),
            ],
            "agent_mismatch",
        ),
        (
            [
                ("Authorization", mallory["Authorization"]),
                ("X-CSF-Agent-ID", "mallory"),
                ("X-CSF-Session-ID", "a-1"),
                ("X-CSF-Session-ID", "m-1"),
            ],
            "session_mismatch",
        ),
    ]
    for headers, cause in cases:
        for name, arguments in TOOL_CALLS:
            assert await world.unauthorized(headers, name, arguments) == cause, (headers, name)
    assert await world.snapshot("alice", "bob", "mallory") == before
    # A duplicate after a valid first header is ignored: the caller stays who the token says.
    doubled = [*mallory.items(), ("X-CSF-Agent-ID", "alice"), ("Authorization", alice["Authorization"])]
    response = await world.post(doubled, "FetchAgentInbox", {})
    assert response.status_code == 200 and response.json()["result"]["structuredContent"] == {"envelopes": []}


async def test_every_truncation_and_splice_of_a_token_is_refused(world: World) -> None:
    await world.ok(world.headers("alice", "a-1"), "RegisterAgentAddress", REGISTER)
    before = await world.snapshot("alice")
    good = world.headers("alice", "a-1")
    token = good["Authorization"].removeprefix("Bearer ")
    _, header, claims, sig = token.split(".")
    payload = f"{header}.{claims}"
    bob_token = world.headers("bob", "b-1")["Authorization"].removeprefix("Bearer ")
    _, bob_header, bob_claims, bob_sig = bob_token.split(".")
    bob_payload = f"{bob_header}.{bob_claims}"
    variants = [token[:n] for n in range(1, len(token))]  # every prefix (the empty one is below)
    variants += [
        token[1:],
        f"v1.{payload}.{sig}.",
        f"v1.{payload}.{sig}.{sig}",
        f"v1.{payload}{sig}",
        f"v1..{sig}",
        f"v1.{payload}.",
        f"v1.{payload}=.{sig}",
        f"v1.{payload}.{sig}=",
        f"v1.{payload}.{sig[:-1]}",
        f"v1.{payload[:-1]}.{sig}",
        f"v1.{payload} .{sig}",
        f"v1.{payload}.{bob_sig}",  # alice's claims under bob's signature
        f"v1.{bob_payload}.{sig}",  # bob's claims under alice's signature
        f"v1.{header}.{bob_claims}.{sig}",  # bob's claims under alice's header and signature
        f"v1.{claims}.{header}.{sig}",  # header and claims swapped
        f"v1.{header}.{claims}",  # no signature
        f"v1.{header}.{claims}.",
        f"{header}.{claims}.{sig}",  # a bare JWT without the version
        f"v2.{payload}.{sig}",
        f"V1.{payload}.{sig}",
        token + "A",
    ]
    causes: dict[str, int] = {}
    for variant in variants:
        headers = {**good, "Authorization": f"Bearer {variant}"}
        cause = await world.unauthorized(headers, "FetchAgentInbox", {})
        assert cause in {
            "missing_authorization",
            "malformed_token",
            "bad_signature",
            "unsupported_token_version",
        }, (
            variant,
            cause,
        )
        causes[cause] = causes.get(cause, 0) + 1
    for scheme in ("Basic", "Token", "Bearer", ""):
        headers = {**good, "Authorization": f"{scheme} {token if scheme != 'Bearer' else ''}".strip()}
        assert await world.unauthorized(headers, "FetchAgentInbox", {}) == "malformed_authorization", scheme
    no_header = {k: v for k, v in good.items() if k != "Authorization"}
    assert await world.unauthorized(no_header, "FetchAgentInbox", {}) == "missing_authorization"
    assert causes["bad_signature"] >= 2 and causes["malformed_token"] > len(token) // 2, causes
    assert await world.snapshot("alice") == before
    # The intact token still works (nothing above was refused for a reason other than the token).
    assert (await world.ok(good, "FetchAgentInbox", {}))["envelopes"] == []


async def test_tool_arguments_cannot_name_another_agent(world: World) -> None:
    alice, _bob, mallory, ids = await _alice_with_mail(world)
    before = await world.snapshot("alice")
    got = await world.post(mallory, "FetchAgentInbox", {"agent": "alice", "limit": 16})
    assert got.status_code == 200
    result = got.json()["result"]
    assert result.get("isError") or result["structuredContent"]["envelopes"] == []
    sent = await world.post(
        mallory,
        "SendAgentMessage",
        {"to": "mallory", "from": "alice", "message": {"kind": 1, "text": "who am i"}},
    )
    result = sent.json()["result"]
    if not result.get("isError"):
        (envelope,) = (await world.ok(mallory, "FetchAgentInbox", {}))["envelopes"]
        assert envelope["from"] == "mallory"
    err = await world.refused(
        mallory, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "x", "from": "bob"}}
    )
    assert err["code"] == "contract_violation"
    assert [(v["field"], v["rule"]) for v in err["violations"]] == [("from", "unknown_field")]
    registered = await world.post(
        mallory, "RegisterAgentAddress", {**REGISTER, "agent": "alice", "endpoint": "unix:/tmp/evil"}
    )
    result = registered.json()["result"]
    if not result.get("isError"):
        assert result["structuredContent"]["agent"] == "mallory"
    acked = await world.post(mallory, "AcknowledgeAgentInbox", {"ids": ids, "agent": "alice"})
    result = acked.json()["result"]
    assert result.get("isError") or result["structuredContent"] == {"acknowledged": [], "unknown": ids}
    after = await world.snapshot("alice")
    assert after == before
    assert after["alice"]["registration"]["endpoint"] == "127.0.0.1:14111"
    assert [e["id"] for e in (await world.ok(alice, "FetchAgentInbox", {}))["envelopes"]] == ids


async def test_nobody_but_the_recipient_can_fetch_or_acknowledge_its_envelopes(world: World) -> None:
    alice, bob, mallory, ids = await _alice_with_mail(world)
    before = await world.snapshot("alice")
    # mallory fetches her own (empty) inbox only
    assert (await world.ok(mallory, "FetchAgentInbox", {"limit": 256}))["envelopes"] == []
    # neither a third agent nor the sender (who knows the ids) can acknowledge them
    for headers in (mallory, bob):
        done = await world.ok(headers, "AcknowledgeAgentInbox", {"ids": ids})
        assert done == {"acknowledged": [], "unknown": ids}
    # alice herself cannot acknowledge with a guessed nonce: same position, different nonce
    forged = [i[:-10] + ("0" * 10 if i[-10:] != "0" * 10 else "1" * 10) for i in ids]
    forged += [i[:-1] + ("0" if i[-1] != "0" else "1") for i in ids]
    assert await world.ok(alice, "AcknowledgeAgentInbox", {"ids": forged}) == {
        "acknowledged": [],
        "unknown": forged,
    }
    assert await world.snapshot("alice") == before
    got = (await world.ok(alice, "FetchAgentInbox", {}))["envelopes"]
    assert [(e["id"], e["deliveries"]) for e in got] == [(i, 2) for i in ids]
    assert (await world.ok(alice, "AcknowledgeAgentInbox", {"ids": ids}))["acknowledged"] == ids


async def test_a_superseded_session_can_only_register_again(world: World) -> None:
    old, bob = world.headers("alice", "old"), world.headers("bob", "b-1")
    await world.ok(old, "RegisterAgentAddress", REGISTER)
    await world.ok(bob, "RegisterAgentAddress", REGISTER)
    sent = await world.ok(bob, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "kept"}})
    assert [e["id"] for e in (await world.ok(old, "FetchAgentInbox", {}))["envelopes"]] == [sent["id"]]
    new = world.headers("alice", "new")
    assert (await world.ok(new, "RegisterAgentAddress", REGISTER))["superseded_session"] == "old"
    before = await world.snapshot("alice", "bob")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "from the past"}}),
        ("SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "to myself"}}),
        ("FetchAgentInbox", {"limit": 16}),
        ("FetchAgentInbox", {"limit": 16, "wait_ms": 20000}),
        ("AcknowledgeAgentInbox", {"ids": [sent["id"]]}),
    ]
    for name, arguments in calls:
        started = time.monotonic()
        err = await world.refused(old, name, arguments)
        assert err["code"] == "session_superseded" and err["retryable"] is False, (name, err)
        assert err["agent"] == "alice" and err["session"] == "old"
        assert time.monotonic() - started < 10  # refused at once, never parked in a long poll
    # nothing was stored, fetched (no delivery counted) or acknowledged by the old session
    assert await world.snapshot("alice", "bob") == before
    got = (await world.ok(new, "FetchAgentInbox", {}))["envelopes"]
    assert [(e["id"], e["deliveries"]) for e in got] == [(sent["id"], 2)]
    # Supersession is not revocation: the old token still authenticates and may take the inbox back
    # by registering again (documented in SECURITY.md; revoke by rotating the signing key).
    assert (await world.ok(old, "RegisterAgentAddress", REGISTER))["superseded_session"] == "new"
    assert (await world.refused(new, "FetchAgentInbox", {}))["code"] == "session_superseded"


async def test_key_rotation_over_http(redis_url: str, tmp_path: Path) -> None:
    """A token keeps working while its key is listed, and stops as soon as the key is removed."""
    old_key, new_key = generate_key(), generate_key()
    path = tmp_path / "relay.key"

    def keyring(*lines: str) -> KeyRing:
        path.write_text("".join(f"{line}\n" for line in lines))
        path.chmod(0o600)
        return load_key_file(path)

    before = keyring(old_key)
    old_token = agent_headers(before, "alice", "a-1")
    both = keyring(new_key, old_key)
    new_token = agent_headers(both, "alice", "a-1")
    assert both.signing_kid != before.signing_kid
    after = keyring(new_key)
    expected = {
        "old only": (before, {"old": 200, "new": 401}),
        "new first, old kept": (both, {"old": 200, "new": 200}),
        "old removed": (after, {"old": 401, "new": 200}),
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with running_front(redis_url) as front, httpx2.AsyncClient(timeout=30) as http:
        for stage, (ring, statuses) in expected.items():
            # what `relay serve` does after a restart with the edited key file
            async with serve_app(create_app(front.relay, keyring=ring)) as base:
                for which, headers in (("old", old_token), ("new", new_token)):
                    response = await http.post(
                        f"{base}/mcp/agent", json=body, headers={**MCP_HEADERS, **headers}
                    )
                    assert response.status_code == statuses[which], (stage, which, response.text)
                    if response.status_code == 401:
                        assert response.json()["error"]["data"]["cause"] == "unknown_key"


def test_key_files_are_checked_through_symlinks(tmp_path: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_text(generate_key() + "\n")
    loose.chmod(0o644)
    link = tmp_path / "relay.key"
    link.symlink_to(loose)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_key_file(link)
    loose.chmod(0o600)
    assert load_key_file(link).signing_kid == load_key_file(loose).signing_kid
