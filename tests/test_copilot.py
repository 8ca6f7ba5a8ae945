"""``relay setup copilot``, ``relay run copilot`` and the Copilot CLI 1.0.102 itself, offline: the setup's
files (one ``.mcp.json`` entry shared with ``relay setup claude-code``, refusals, no secret), then the
real CLI (installed by ``scripts/install-agent-sdks`` into ``.tools/copilot``) started by the launcher
against a real ``relay serve`` and the chat-completions fake (``COPILOT_OFFLINE``), in a fresh ``HOME``
whose trusted folder is the set-up one (what the user's answer writes, ``~/.copilot/config.json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from relay.copilot.setup import HOOKS_FILE, MCP_FILE
from tests.agent_clis import AGENT_TOOLS, WAKE_BOUND_S, clean_environment, run_cli, secrets_in
from tests.claude_code import ClaudeHome, claude_binary_fixture, run_claude, stop_tree
from tests.claude_code_relay import mcp_status, relay_serving
from tests.fake_openai import FakeOpenAI, Recorded, Text, ToolUse, tool_results
from tests.processes import REGISTER, ServeProcess, call_tool_sync, run_relay
from tests.workbench_support import COPILOT_CACHE, COPILOT_CLI, COPILOT_VERSION

__all__ = ["claude_binary_fixture"]

ANNOUNCE_WITHIN_S = WAKE_BOUND_S
NOTE = "Review done: ship PR 12 once the changelog names the flag."
RELAY_FUNCTIONS = {f"relay-{name}" for name in AGENT_TOOLS}


def _suffix() -> str:
    return str(time.monotonic_ns())[-7:]


def _setup(
    client: str, folder: Path, url: str, agent: str, redis_url: str
) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return run_relay(
        "setup", client, "--url", url, "--agent", agent, "--redis-url", redis_url, "--dir", folder
    )


# --- the files -----------------------------------------------------------------------------------------


def test_setup_writes_variable_headers_and_the_hook_and_no_secret(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"

    done = _setup("copilot", folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 0, done.stderr
    entry = json.loads((folder / MCP_FILE).read_text())["mcpServers"]["relay"]
    assert entry == {
        "type": "http",
        "url": "http://127.0.0.1:9/mcp/agent",
        "headers": {
            "Authorization": "${RELAY_AUTHORIZATION:-}",
            "X-CSF-Agent-ID": "${RELAY_AGENT_ID:-}",
            "X-CSF-Session-ID": "${RELAY_SESSION_ID:-}",
        },
    }
    hooks = json.loads((folder / HOOKS_FILE).read_text())
    (hook,) = hooks["hooks"]["agentStop"]
    assert hooks["version"] == 1 and " hook after-turn --credential-file " in hook["bash"]
    assert "--answer decision" in hook["bash"]
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []
    assert "cannot be woken while idle" in done.stdout and "15 minutes" in done.stdout


@pytest.mark.parametrize("order", [("claude-code", "copilot"), ("copilot", "claude-code")])
def test_a_folder_set_up_for_both_keeps_both_entries(
    tmp_path: Path, redis_url: str, order: tuple[str, str]
) -> None:
    folder, agent = tmp_path / "author", f"author-{_suffix()}"
    servers = {"docs": {"type": "http", "url": "http://127.0.0.1:7/mcp"}}
    folder.mkdir()
    (folder / MCP_FILE).write_text(json.dumps({"mcpServers": servers}))

    for client in (*order, order[0]):
        done = _setup(client, folder, "http://127.0.0.1:9", agent, redis_url)
        assert done.returncode == 0, done.stderr

    written = json.loads((folder / MCP_FILE).read_text())["mcpServers"]
    assert written["docs"] == servers["docs"]
    assert " hook headers --credential-file " in written["relay"]["headersHelper"]
    assert written["relay"]["headers"]["Authorization"] == "${RELAY_AUTHORIZATION:-}"


def test_a_malformed_mcp_json_is_refused_and_nothing_is_written(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    folder.mkdir()
    (folder / MCP_FILE).write_text('{"mcpServers": [1]}')

    done = _setup("copilot", folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 2 and "'mcpServers' is not a JSON object" in done.stderr, done.stderr
    assert sorted(p.name for p in folder.rglob("*")) == [".mcp.json"]


# --- the real CLI ------------------------------------------------------------------------------------------


@dataclass
class CopilotWorld:
    tmp: Path
    serve: ServeProcess
    key: Path
    api: FakeOpenAI
    redis_url: str

    def folder(self, name: str) -> tuple[Path, str, dict[str, str]]:
        """A folder set up for Claude Code and the Copilot CLI, trusted in a fresh ``HOME``."""
        folder, home, agent = self.tmp / name, self.tmp / f"{name}-home", f"{name}-{_suffix()}"
        for client in ("claude-code", "copilot"):
            done = _setup(client, folder, self.serve.url, agent, self.redis_url)
            assert done.returncode == 0, done.stderr
        (home / ".copilot").mkdir(parents=True)
        (home / ".copilot" / "config.json").write_text(json.dumps({"trustedFolders": [str(folder)]}))
        env = clean_environment(
            home,
            {
                "XDG_CACHE_HOME": str(COPILOT_CACHE),
                "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_BASE_URL": self.api.base_url + "/v1",
                "COPILOT_PROVIDER_API_KEY": "offline",
                "COPILOT_MODEL": "fake-model",
            },
        )
        return folder, agent, env

    def relay_run(self, folder: Path, *args: str) -> list[str]:
        run = [sys.executable, "-m", "relay", "run", "--dir", str(folder), "--command", str(COPILOT_CLI)]
        return [*run, "copilot", *args]


@pytest.fixture(scope="module")
def copilot_world(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CopilotWorld]:
    if not COPILOT_CLI.exists():
        pytest.skip(
            f"the Copilot CLI {COPILOT_VERSION} is not installed at {COPILOT_CLI}; "
            "run scripts/install-agent-sdks"
        )
    tmp = tmp_path_factory.mktemp("copilot")
    with relay_serving(tmp, redis_url) as (serve, key), FakeOpenAI() as api:
        yield CopilotWorld(tmp, serve, key, api, redis_url)


def _send(world: CopilotWorld, to: str, text: str) -> float:
    headers = agent_headers(load_key_file(world.key), f"reviewer-{_suffix()}", "s1", 600)
    call_tool_sync(world.serve.url, headers, "RegisterAgentAddress", REGISTER)
    call_tool_sync(
        world.serve.url, headers, "SendAgentMessage", {"to": to, "message": {"kind": "note", "text": text}}
    )
    return time.monotonic()


def _functions(recorded: Recorded) -> set[str]:
    return {str(t.get("function", {}).get("name")) for t in recorded.body.get("tools") or []}


def _results(requests: list[Recorded]) -> str:
    return json.dumps([r for q in requests for r in tool_results(q)])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_folder_for_both_connects_in_both_and_a_turn_fetches_the_note(
    copilot_world: CopilotWorld, claude_binary: Path
) -> None:
    world, api = copilot_world, copilot_world.api
    folder, agent, env = world.folder("author")
    claude = run_claude(
        claude_binary, ClaudeHome(world.tmp / "claude-home", trusted=[folder]).write(), folder, "mcp", "list"
    )
    launched = run_cli(world.relay_run(folder, "--version"), folder, env)  # the launcher registers the agent
    assert launched.returncode == 0, launched.stderr
    _send(world, agent, NOTE)  # the note waits in the agent's inbox
    register = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
    api.reply(ToolUse("relay-RegisterAgentAddress", register))
    api.reply(ToolUse("relay-FetchAgentInbox", {}))
    api.reply(Text("Read the review."))
    first = len(api.requests)
    proc = subprocess.Popen(
        world.relay_run(folder, "--allow-all-tools", "-p", "register, then read your inbox"),
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        fetched = api.wait_for(
            lambda r: "envelopes" in _results([r]), 120, after=first, what="with the fetch"
        )
        _, err = proc.communicate(timeout=120)
    finally:
        stop_tree(proc)

    assert mcp_status(claude.stdout, "relay") == "✔ Connected", claude.stdout + claude.stderr
    assert proc.returncode == 0, err[-3000:]
    turns = [r for r in api.requests[first:] if r.is_conversation]
    assert _functions(turns[0]) >= RELAY_FUNCTIONS
    assert NOTE in _results([fetched]) and "superseded" not in _results(turns)
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mail_arriving_during_a_turn_is_announced_when_it_ends(copilot_world: CopilotWorld) -> None:
    world, api = copilot_world, copilot_world.api
    folder, agent, env = world.folder("reviewer")
    api.reply(Text("Working on it."))
    api.reply(ToolUse("relay-FetchAgentInbox", {}))
    api.reply(Text("Read the review."))
    first = len(api.requests)
    api.hold()
    proc = subprocess.Popen(
        world.relay_run(folder, "--allow-all-tools", "-p", "work on the release"),
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        api.wait_for(lambda r: r.is_conversation, 120, after=first, what="of the turn")
        _send(world, agent, NOTE)
        ended = time.monotonic()
        api.release()
        announced = api.wait_for(
            lambda r: r.is_conversation and f"new message for {agent}" in r.last_user_text(),
            60,
            after=first,
            what="carrying relay's summary (the agentStop hook)",
        )
        fetched = api.wait_for(lambda r: NOTE in _results([r]), 60, after=first, what="with the fetched note")
        _, err = proc.communicate(timeout=120)
    finally:
        api.release()
        stop_tree(proc)

    took = announced.at - ended
    assert took < ANNOUNCE_WITHIN_S, f"announced {took:.2f} s after the turn's model answer"
    assert proc.returncode == 0, err[-3000:]
    assert fetched.at >= announced.at
    assert "from reviewer-" in announced.last_user_text()


RELAY_HOOK = (sys.executable, "-m", "relay", "hook")


def test_claude_codes_waiter_steps_aside_when_the_copilot_cli_runs_it(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        done = subprocess.run(
            [
                *RELAY_HOOK,
                "wait",
                "--credential-file",
                str(tmp_path / "none"),
                "--claude-pid",
                str(sleeper.pid),
            ],
            input="{}",
            env={**os.environ, "COPILOT_CLI": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        sleeper.kill()
        sleeper.wait()

    assert done.returncode == 0 and "run by the Copilot CLI" in done.stdout and done.stderr == ""
