"""The TypeScript MCP SDK (the client family behind Claude Code and the Inspector) against relay.

Skipped when node/npm are missing; the SDK is installed once into ``tests/clients/node_modules``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.front_support import running_front

CLIENTS = Path(__file__).resolve().parent / "clients"
SDK_VERSION = "1.32.2"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node_sdk() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    marker = CLIENTS / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
    if not marker.exists() or json.loads(marker.read_text()).get("version") != SDK_VERSION:
        result = subprocess.run(
            [
                "npm",
                "install",
                "--no-save",
                "--no-audit",
                "--no-fund",
                "--silent",
                "--prefix",
                str(CLIENTS),
                f"@modelcontextprotocol/sdk@{SDK_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            pytest.skip(f"could not install the TypeScript MCP SDK: {result.stderr.strip()[:200]}")
    return CLIENTS / "ts_client.mjs"


async def _run(script: Path, url: str, headers: dict[str, str], steps: list[Any]) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        url,
        json.dumps(headers),
        json.dumps(steps),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=CLIENTS,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


@pytest.mark.asyncio
async def test_typescript_sdk_client_runs_the_two_agent_walkthrough(node_sdk: Path, redis_url: str) -> None:
    async with running_front(redis_url) as front:
        register = ["RegisterAgentAddress", {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}]
        bob = await _run(node_sdk, front.url, front.headers("bob", "ts-b"), [register])
        assert bob[0]["names"] == [
            "AcknowledgeAgentInbox",
            "FetchAgentInbox",
            "GetMessageStatus",
            "ListAgents",
            "RegisterAgentAddress",
            "SearchAgentMessages",
            "SendAgentMessage",
        ]
        assert bob[1]["structured"]["tier"] == "host"
        alice = await _run(
            node_sdk,
            front.url,
            front.headers("alice", "ts-a"),
            [register, ["SendAgentMessage", {"to": "bob", "message": {"kind": 2, "text": "from ts"}}]],
        )
        sent_id = alice[2]["structured"]["id"]
        fetched = await _run(
            node_sdk, front.url, front.headers("bob", "ts-b"), [["FetchAgentInbox", {"limit": 16}]]
        )
        (envelope,) = fetched[1]["structured"]["envelopes"]
        assert (
            envelope["id"] == sent_id
            and envelope["from"] == "alice"
            and envelope["message"]["text"] == "from ts"
        )
        acked = await _run(
            node_sdk,
            front.url,
            front.headers("bob", "ts-b"),
            [["AcknowledgeAgentInbox", {"ids": [sent_id]}], ["FetchAgentInbox", {}]],
        )
        assert acked[1]["structured"] == {"acknowledged": [sent_id], "unknown": []}
        assert acked[2]["structured"] == {"envelopes": []}
        refused = await _run(
            node_sdk,
            front.url,
            front.headers("alice", "ts-a"),
            [["SendAgentMessage", {"to": "nobody", "message": {"kind": 1, "text": "x"}}]],
        )
        assert (
            refused[1]["isError"] and json.loads(refused[1]["text"])["error"]["code"] == "unknown_recipient"
        )


@pytest.mark.asyncio
async def test_typescript_sdk_client_sees_the_401_cause(node_sdk: Path, redis_url: str) -> None:
    async with running_front(redis_url) as front:
        headers = {**front.headers("alice", "ts-a"), "X-CSF-Session-ID": "other"}
        out = await _run(node_sdk, front.url, headers, [])
        assert out[0]["step"] == "error" and "session_mismatch" in out[0]["message"]
