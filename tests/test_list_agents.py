"""``ListAgents`` through the official MCP client: pages, fields, refusals; ``relay serve --directory
off`` hides it; the ``human`` provider only where the front accepts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker import schemas
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.front_support import Front, key_file, running_front
from tests.processes import REGISTER, ServeProcess, run_relay

REFUSED: list[dict[str, Any]] = [
    {"limit": 0},
    {"limit": schemas.MAX_LIST_AGENTS + 1},
    {"limit": 1.5},
    {"limit": True},
    {"after": "Not An Id"},
    {"after": 7},
    {"agent": "bob"},
]


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


def error_of(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    return dict(json.loads(result.content[0].text)["error"])


async def test_list_agents_pages_through_the_registered_agents(front: Front) -> None:
    validator = Draft202012Validator(schemas.AGENTS)
    async with front.client("alice", "a-1") as alice:
        for name in ("carol", "bob"):
            async with front.client(name, f"{name}-1") as other:
                assert not (await other.call_tool("RegisterAgentAddress", REGISTER)).is_error
        assert error_of(await alice.call_tool("ListAgents", {}))["code"] == "unregistered_agent"
        assert not (await alice.call_tool("RegisterAgentAddress", REGISTER)).is_error
        everyone = (await alice.call_tool("ListAgents", {})).structured_content
        assert not list(validator.iter_errors(everyone))
        assert [a["id"] for a in everyone["agents"]] == ["alice", "bob", "carol"] and "next" not in everyone
        first = everyone["agents"][0]
        assert set(first) == {"id", "provider", "tier", "presence", "last_seen"}  # no endpoint, no session
        assert first["presence"] == "live"  # it registered just now
        assert (first["provider"], first["tier"]) == ("claudecode", "host")
        page = (await alice.call_tool("ListAgents", {"limit": 2})).structured_content
        assert [a["id"] for a in page["agents"]] == ["alice", "bob"] and page["next"] == "bob"
        rest = (await alice.call_tool("ListAgents", {"limit": 2, "after": page["next"]})).structured_content
        assert [a["id"] for a in rest["agents"]] == ["carol"] and "next" not in rest
    async with front.client("alice", "a-2") as newer:
        assert not (await newer.call_tool("RegisterAgentAddress", REGISTER)).is_error
    async with front.client("alice", "a-1") as old:
        assert error_of(await old.call_tool("ListAgents", {}))["code"] == "session_superseded"


async def test_list_agents_refuses_what_its_schema_refuses(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        assert not (await alice.call_tool("RegisterAgentAddress", REGISTER)).is_error
        for arguments in REFUSED:
            assert list(Draft202012Validator(schemas.LIST_AGENTS_ARGUMENTS).iter_errors(arguments))
            error = error_of(await alice.call_tool("ListAgents", arguments))
            assert error["code"] == "invalid_argument" and error["violations"][0]["rule"], error


async def test_the_human_provider_is_refused_to_agents(front: Front) -> None:
    async with front.client("ada", "shell") as ada:
        error = error_of(
            await ada.call_tool("RegisterAgentAddress", {"provider": "human", "endpoint": "ada"})
        )
        assert error["code"] == "invalid_address" and "claudecode" in error["message"]


async def test_directory_off_hides_list_agents(tmp_path: Path, redis_url: str) -> None:
    key = key_file(tmp_path)
    args = ["--redis-url", redis_url, "--agent-mcp-key-file", str(key), "--directory", "off"]
    worker = ServeProcess(args, tmp_path / "serve.log").start()
    try:
        headers = agent_headers(load_key_file(key), "alice", "a-1")
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(worker.url, http_client=http)) as alice,
        ):
            names = {tool.name for tool in (await alice.list_tools()).tools}
            assert "ListAgents" not in names and "SendAgentMessage" in names
            registered = await alice.call_tool(
                "RegisterAgentAddress", {"provider": "human", "endpoint": "al"}
            )
            assert registered.is_error  # people are registered by `relay send` and the dashboard only
            with pytest.raises(Exception, match="unknown tool"):
                await alice.call_tool("ListAgents", {})
    finally:
        assert worker.stop() == 0
    bad = run_relay("serve", "--directory", "maybe")
    assert bad.returncode == 2 and "--directory" in bad.stderr
