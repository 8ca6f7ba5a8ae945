"""``POST /agent/token`` and the revocation gate when the credential store does not answer, in an
in-process front (uvicorn in the test's loop) on the test run's Redis, whose credential store is a
Redis on a loopback port where nothing listens: a clear retryable 503, nothing minted, no traceback;
and the gate on a Redis of its own that the test stops: it keeps its last answer per credential."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx2
import pytest
from prometheus_client import CollectorRegistry

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.credentials import RedisCredentials
from adapters.redis.embedded import EmbeddedRedis
from broker.agent_message import AgentMessageContract
from broker.credentials import new_credential
from broker.errors import BackendUnavailable
from broker.front.app import create_app
from broker.front.paths import TOKEN_PATH
from broker.front.token_route import CredentialGate
from broker.front.tokens import AGENT_HEADER, SESSION_HEADER, AgentIdentity, AuthError, KeyRing
from broker.relay import Relay
from tests.front_support import free_port, serve_app
from tests.processes import MCP_HEADERS, tool_call_body
from tests.support import unique_prefix


@pytest.fixture
async def front(redis_url: str) -> AsyncIterator[tuple[str, KeyRing]]:
    keyring = KeyRing([secrets.token_bytes(32)])
    connection = RedisConnection(RedisSettings(url=redis_url, prefix=unique_prefix()))
    down = RedisConnection(RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0"))
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
    )
    async with relay:
        app = create_app(relay, keyring=keyring, credentials=RedisCredentials(down))
        async with serve_app(app) as base:
            yield base, keyring
    await down.close()


async def test_an_exchange_while_the_store_is_down_is_a_retryable_503(front: tuple[str, KeyRing]) -> None:
    base, _ = front
    _, text = new_credential("alice", now_ms=1)
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(
            base + TOKEN_PATH,
            json={"agent": "alice", "session": "s1"},
            headers={"authorization": f"Bearer {text}"},
        )
        again = await http.get(base + TOKEN_PATH)
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert (
        error["code"] == "backend_unavailable" and error["retryable"] is True and "token" not in answer.json()
    )
    assert "Traceback" not in answer.text
    assert again.status_code == 405 and again.headers["allow"] == "POST"


async def test_a_credential_token_the_gate_never_checked_gets_503_while_the_store_is_down(
    front: tuple[str, KeyRing],
) -> None:
    base, keyring = front
    record, _ = new_credential("alice", now_ms=1)
    token = keyring.mint("alice", "s1", 60, credential=record.id)
    headers = {**MCP_HEADERS, "authorization": f"Bearer {token}", AGENT_HEADER: "alice", SESSION_HEADER: "s1"}
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(
            base + "/mcp/agent", json=tool_call_body("FetchAgentInbox", {}), headers=headers
        )
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["data"]["code"] == "backend_unavailable"


async def test_a_front_without_credentials_refuses_credential_tokens(redis_url: str) -> None:
    keyring = KeyRing([secrets.token_bytes(32)])
    connection = RedisConnection(RedisSettings(url=redis_url, prefix=unique_prefix()))
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
    )
    record, _ = new_credential("alice", now_ms=1)
    token = keyring.mint("alice", "s1", 60, credential=record.id)
    headers = {**MCP_HEADERS, "authorization": f"Bearer {token}", AGENT_HEADER: "alice", SESSION_HEADER: "s1"}
    async with (
        relay,
        serve_app(create_app(relay, keyring=keyring)) as base,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        answer = await http.post(
            base + "/mcp/agent", json=tool_call_body("FetchAgentInbox", {}), headers=headers
        )
        missing = await http.post(base + TOKEN_PATH, json={})
    assert answer.status_code == 401 and answer.json()["error"]["data"]["cause"] == "unknown_credential"
    assert missing.status_code in (404, 405)


async def test_the_gate_keeps_its_last_answer_while_the_store_is_down(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    connection = RedisConnection(RedisSettings(url=server.url, prefix=unique_prefix()))
    try:
        store = RedisCredentials(connection)
        checked, _ = new_credential("alice", now_ms=1)
        revoked, _ = new_credential("alice", now_ms=1)
        never, _ = new_credential("alice", now_ms=1)
        for record in (checked, revoked, never):
            await store.add(record)
        await store.revoke(revoked.id, 2)
        gate = CredentialGate(store, max_age=0)  # asks the store on every check
        identity = AgentIdentity("alice", "s1", 2**40, checked.id)
        await gate.check(identity)
        with pytest.raises(AuthError) as refused:
            await gate.check(replace(identity, credential=revoked.id))
        assert refused.value.cause == "revoked"
        server.stop()
        await gate.check(identity)  # the store is gone: the last answer stands
        with pytest.raises(AuthError):
            await gate.check(replace(identity, credential=revoked.id))
        with pytest.raises(BackendUnavailable):  # never checked: nothing to go on
            await gate.check(replace(identity, credential=never.id))
    finally:
        await connection.close()
        server.stop()
