"""The agent MCP endpoint over real HTTP (uvicorn on loopback) with the official ``mcp`` client."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

import httpx2
import pytest
from mcp import MCPError

from broker.front.tools import MAX_FETCH_RESPONSE_BYTES
from tests.front_support import Front, data, error, running_front
from tests.processes import REGISTER

pytestmark = pytest.mark.asyncio

MODES = ["auto", "legacy"]  # 2026-07-28 single-exchange era, and the 2025-11-25 initialize handshake


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


@pytest.mark.parametrize("mode", MODES)
async def test_the_two_agent_walkthrough(front: Front, mode: str) -> None:
    async with front.client("alice", "a-1", mode) as alice, front.client("bob", "b-1", mode) as bob:
        names = {t.name for t in (await alice.list_tools()).tools}
        assert names == {
            "RegisterAgentAddress",
            "SendAgentMessage",
            "FetchAgentInbox",
            "AcknowledgeAgentInbox",
            "ListAgents",
            "GetMessageStatus",
            "SearchAgentMessages",
        }

        reg = data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        assert reg["agent"] == "alice" and reg["session"] == "a-1" and reg["tier"] == "host"
        data(
            await bob.call_tool(
                "RegisterAgentAddress", {"provider": "claudecode", "endpoint": "unix:/tmp/bob.sock"}
            )
        )

        sent = data(
            await alice.call_tool(
                "SendAgentMessage", {"to": "bob", "message": {"kind": 2, "text": "review PR 12?"}}
            )
        )
        assert sent["to"] == "bob" and sent["tier"] == "host" and sent["id"].startswith("env_")
        assert sent["sent_at"].endswith("Z")

        inbox = data(await bob.call_tool("FetchAgentInbox", {"limit": 16}))
        (envelope,) = inbox["envelopes"]
        assert envelope["id"] == sent["id"] and envelope["from"] == "alice" and envelope["tier"] == "host"
        assert envelope["message"] == {"kind": 2, "text": "review PR 12?"}
        assert data(await bob.call_tool("FetchAgentInbox", {}))["envelopes"][0]["id"] == sent["id"]

        reply = {
            "kind": 3,
            "text": "approved",
            "in_reply_to": sent["id"],
            "reference": "https://example.org/pr/12",
        }
        data(await bob.call_tool("SendAgentMessage", {"to": "alice", "message": reply}))
        acked = data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": [sent["id"]]}))
        assert acked == {"acknowledged": [sent["id"]], "unknown": []}
        assert data(await bob.call_tool("FetchAgentInbox", {"limit": 16}))["envelopes"] == []

        got = data(await alice.call_tool("FetchAgentInbox", {"limit": 1}))["envelopes"]
        assert got[0]["message"] == reply and got[0]["from"] == "bob"
        again = data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": [sent["id"]]}))
        assert again == {"acknowledged": [], "unknown": [sent["id"]]}


async def test_kind_names_are_accepted(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        data(
            await alice.call_tool(
                "SendAgentMessage", {"to": "alice", "message": {"kind": "status", "text": "ok"}}
            )
        )
        (got,) = data(await alice.call_tool("FetchAgentInbox", {}))["envelopes"]
        assert got["message"]["kind"] == 4


async def test_contract_violations_are_listed_and_nothing_is_stored(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        bad = {"kind": 3, "text": "", "reference": ""}
        err = error(await alice.call_tool("SendAgentMessage", {"to": "alice", "message": bad}))
        assert err["code"] == "contract_violation" and err["retryable"] is False
        found = {(v["field"], v["rule"]) for v in err["violations"]}
        assert found == {
            ("text", "required"),
            ("reference", "string.min_len"),
            ("", "agent_message.reply_requires_in_reply_to"),
        }
        err = error(
            await alice.call_tool(
                "SendAgentMessage",
                {"to": "alice", "message": {"kind": 1, "text": "x", "in_reply_to": "nope"}},
            )
        )
        assert err["violations"][0]["field"] == "in_reply_to"
        assert data(await alice.call_tool("FetchAgentInbox", {}))["envelopes"] == []


async def test_bad_arguments_get_precise_errors(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        for args in ({"limit": 0}, {"limit": 257}, {"limit": "many"}, {"wait_ms": -1}):
            result = await alice.call_tool("FetchAgentInbox", args)
            assert result.is_error and (
                "limit" in result.content[0].text or "wait_ms" in result.content[0].text
            )
        result = await alice.call_tool(
            "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "x", "extra": 1}}
        )
        assert result.is_error and "extra" in result.content[0].text
        err = error(
            await alice.call_tool("SendAgentMessage", {"to": "Bad:Id", "message": {"kind": 1, "text": "x"}})
        )
        assert err["code"] == "invalid_argument" and err["violations"][0]["field"] == "to"
        err = error(await alice.call_tool("AcknowledgeAgentInbox", {"ids": ["relay:inbox:{alice}"]}))
        assert err["code"] == "invalid_argument" and err["violations"][0]["field"] == "ids[0]"


async def test_only_host_tier_addresses_register(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        for provider, endpoint in [
            ("workbench", "session-1"),
            ("remote", "agents.example.net:443"),
            ("claudecode", "10.0.0.5:80"),
            ("claudecode", "unix:relative/path"),
            ("claudecode", "example.com:80"),
            ("nope", "127.0.0.1:1"),
        ]:
            err = error(
                await alice.call_tool("RegisterAgentAddress", {"provider": provider, "endpoint": endpoint})
            )
            assert err["code"] == "invalid_address", (provider, endpoint)
        assert await front.relay.registration("alice") is None


async def test_unknown_recipient_and_unregistered_caller(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        err = error(await alice.call_tool("FetchAgentInbox", {}))
        assert err["code"] == "unregistered_agent"
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        err = error(
            await alice.call_tool("SendAgentMessage", {"to": "nobody", "message": {"kind": 1, "text": "hi"}})
        )
        assert err["code"] == "unknown_recipient" and "nobody" in err["message"]
        assert await front.relay.registration("nobody") is None


async def test_superseded_and_unregistered_sessions_get_their_own_errors(front: Front) -> None:
    async with front.client("bob", "old") as old, front.client("bob", "new") as new:
        data(await old.call_tool("RegisterAgentAddress", REGISTER))
        data(await old.call_tool("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "kept"}}))
        err = error(await new.call_tool("FetchAgentInbox", {}))
        assert err["code"] == "session_not_registered" and err["session"] == "new"
        assert "RegisterAgentAddress" in err["message"] and "superseded" not in err["message"]
        reg = data(await new.call_tool("RegisterAgentAddress", REGISTER))
        assert reg["superseded_session"] == "old"
        err = error(await old.call_tool("FetchAgentInbox", {}))
        assert err["code"] == "session_superseded" and "register again" not in err["message"]
        (kept,) = data(await new.call_tool("FetchAgentInbox", {}))["envelopes"]
        assert kept["message"]["text"] == "kept"


async def test_an_agent_cannot_acknowledge_another_agents_envelopes(front: Front) -> None:
    async with front.client("alice", "a") as alice, front.client("mallory", "m") as mallory:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        data(await mallory.call_tool("RegisterAgentAddress", REGISTER))
        sent = data(
            await mallory.call_tool("SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "x"}})
        )
        data(await alice.call_tool("FetchAgentInbox", {}))
        acked = data(await mallory.call_tool("AcknowledgeAgentInbox", {"ids": [sent["id"]]}))
        assert acked == {"acknowledged": [], "unknown": [sent["id"]]}
        assert len(data(await mallory.call_tool("FetchAgentInbox", {}))["envelopes"]) == 0
        assert len(data(await alice.call_tool("FetchAgentInbox", {}))["envelopes"]) == 1


async def test_long_poll_returns_as_soon_as_a_message_arrives(front: Front) -> None:
    async with front.client("alice", "a") as alice, front.client("bob", "b") as bob:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
        started = time.monotonic()
        waiting = asyncio.create_task(bob.call_tool("FetchAgentInbox", {"limit": 4, "wait_ms": 20000}))
        sent = data(
            await alice.call_tool("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "wake"}})
        )
        # woken, not timed out: a poll that runs out answers no envelope
        got = data(await asyncio.wait_for(waiting, 60))["envelopes"]
        assert [e["id"] for e in got] == [sent["id"]]
        started = time.monotonic()
        pending = data(await bob.call_tool("FetchAgentInbox", {"wait_ms": 25000}))
        assert len(pending["envelopes"]) == 1  # pending comes back at once: far sooner than the wait
        assert time.monotonic() - started < 12.5


async def test_metrics_health_and_readiness(front: Front) -> None:
    async with front.client("alice", "a") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        data(await alice.call_tool("SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "x"}}))
        data(await alice.call_tool("FetchAgentInbox", {}))
        data(await alice.call_tool("FetchAgentInbox", {}))
    async with httpx2.AsyncClient(base_url=front.base) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).status_code == 200
        text = (await http.get("/metrics")).text
        assert 'csf_relay_envelopes_sent_total{tier="host"} 1.0' in text
        assert 'csf_relay_envelopes_delivered_total{tier="host"} 1.0' in text
        assert 'csf_relay_envelopes_sent_total{tier="network"} 0.0' in text


def _tamper(token: str) -> str:
    """Extend the token's expiry without re-signing it."""
    import base64

    version, header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["exp"] += 86400 * 365
    raw = json.dumps(claims, separators=(",", ":")).encode()
    return ".".join([version, header, base64.urlsafe_b64encode(raw).decode().rstrip("="), signature])


def _rpc(method: str = "tools/list", params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}


MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def test_every_authentication_failure_is_a_401_naming_its_cause(front: Front) -> None:
    good = front.headers("alice", "a-1")
    token = good["Authorization"].removeprefix("Bearer ")
    expired = front.keyring.mint("alice", "a-1", 60, now=time.time() - 3600)
    foreign = front.headers("alice", "a-1")
    from broker.front.tokens import KeyRing

    other = KeyRing([secrets.token_bytes(32)])
    cases: list[tuple[dict[str, str], str]] = [
        ({k: v for k, v in good.items() if k != "Authorization"}, "missing_authorization"),
        ({k: v for k, v in good.items() if k != "X-CSF-Agent-ID"}, "missing_agent_header"),
        ({k: v for k, v in good.items() if k != "X-CSF-Session-ID"}, "missing_session_header"),
        ({**good, "Authorization": "Bearer nonsense"}, "malformed_token"),
        ({**good, "Authorization": token}, "malformed_authorization"),
        ({**good, "Authorization": "Bearer " + _tamper(token)}, "bad_signature"),
        ({**good, "Authorization": "Bearer " + token[: len(token) // 2]}, "malformed_token"),
        ({**good, "Authorization": f"Bearer {expired}"}, "expired"),
        ({**foreign, "Authorization": f"Bearer {other.mint('alice', 'a-1')}"}, "unknown_key"),
        ({**good, "X-CSF-Agent-ID": "bob"}, "agent_mismatch"),
        ({**good, "X-CSF-Session-ID": "a-2"}, "session_mismatch"),
    ]
    async with httpx2.AsyncClient() as http:
        for headers, cause in cases:
            response = await http.post(front.url, json=_rpc(), headers={**MCP_HEADERS, **headers})
            assert response.status_code == 401, cause
            assert response.headers["www-authenticate"].startswith("Bearer")
            body = response.json()
            assert body["jsonrpc"] == "2.0" and body["error"]["data"]["cause"] == cause
            assert cause in body["error"]["message"]
        ok = await http.post(front.url, json=_rpc("ping"), headers={**MCP_HEADERS, **good})
        assert ok.status_code == 200


async def test_mcp_clients_surface_the_authentication_error(front: Front) -> None:
    import contextlib

    import mcp

    headers = {**front.headers("alice", "a-1"), "X-CSF-Agent-ID": "bob"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10))
    for mode in MODES:
        with pytest.raises(BaseException) as caught:
            async with (
                http,
                mcp.Client(
                    mcp.client.streamable_http.streamable_http_client(front.url, http_client=http), mode=mode
                ) as client,
            ):
                await client.list_tools()
        text = repr(caught.value) + "".join(repr(e) for e in getattr(caught.value, "exceptions", []))
        assert "agent_mismatch" in text, text
        with contextlib.suppress(Exception):
            await http.aclose()
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10))
    await http.aclose()
    assert MCPError is not None


async def test_request_bodies_over_the_limit_get_413(redis_url: str) -> None:
    async with running_front(redis_url, max_body_bytes=4096) as front:
        headers = {**MCP_HEADERS, **front.headers("alice", "a")}
        async with httpx2.AsyncClient() as http:
            big = _rpc(
                "tools/call",
                {
                    "name": "SendAgentMessage",
                    "arguments": {"to": "a", "message": {"kind": 1, "text": "x" * 10000}},
                },
            )
            assert (await http.post(front.url, json=big, headers=headers)).status_code == 413


async def test_only_post_is_served_on_the_agent_endpoint(front: Front) -> None:
    """Stateless mode offers no event stream to GET and no session to DELETE."""
    headers = {**MCP_HEADERS, **front.headers("alice", "a-1")}
    async with httpx2.AsyncClient(timeout=5) as http:
        for method in ("GET", "DELETE", "PUT"):
            response = await http.request(method, front.url, headers=headers)
            assert response.status_code == 405 and response.headers["allow"] == "POST"
            assert response.json()["error"]["message"].startswith("method not allowed")


async def test_results_are_structured_only_and_older_clients_get_the_json_as_text(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        result = await alice.call_tool("FetchAgentInbox", {})
        assert result.content == [] and result.structured_content == {"envelopes": []}
    call = {**_rpc("tools/call", {"name": "FetchAgentInbox", "arguments": {}})}
    async with httpx2.AsyncClient() as http:
        for version, structured in (
            ("2025-11-25", True),
            ("2025-06-18", True),
            ("2025-03-26", False),
            (None, False),
        ):
            headers = {**MCP_HEADERS, **front.headers("alice", "a-1")}
            if version is not None:
                headers["mcp-protocol-version"] = version
            answer = (await http.post(front.url, json=call, headers=headers)).json()["result"]
            if structured:
                assert answer["structuredContent"] == {"envelopes": []} and answer["content"] == [], version
            else:
                assert "structuredContent" not in answer, version
                assert json.loads(answer["content"][0]["text"]) == {"envelopes": []}, version


async def test_a_fetch_response_stays_within_its_byte_bound(front: Front) -> None:
    """256 stored texts of 43,000 NULs once made a 143 MB response; now a fetch returns fewer envelopes."""
    nuls = "\x00" * 43_000
    async with front.client("alice", "a-1") as alice:
        data(await alice.call_tool("RegisterAgentAddress", REGISTER))
        for _ in range(8):
            data(
                await alice.call_tool(
                    "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": nuls}}
                )
            )
    call = _rpc("tools/call", {"name": "FetchAgentInbox", "arguments": {"limit": 256}})
    headers = {**MCP_HEADERS, **front.headers("alice", "a-1"), "mcp-protocol-version": "2025-11-25"}
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(front.url, json=call, headers=headers)
    envelopes = response.json()["result"]["structuredContent"]["envelopes"]
    assert len(response.content) <= MAX_FETCH_RESPONSE_BYTES + 4096
    assert 1 <= len(envelopes) < 8 and all(e["message"]["text"] == nuls for e in envelopes)
