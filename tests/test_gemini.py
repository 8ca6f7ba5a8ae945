"""``relay setup gemini``, ``relay run gemini`` and Gemini CLI 0.61 itself, offline: the setup's file
(merging, refusals, no secret), then the real CLI started by the launcher against a real ``relay
serve`` and a fake Gemini API on loopback, in a fresh ``HOME`` whose trusted folder is the set-up one
(what the user's answer to the trust dialog writes, ``~/.gemini/trustedFolders.json``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from relay.gemini.setup import SETTINGS_FILE
from tests.agent_clis import AGENT_TOOLS, WAKE_BOUND_S, clean_environment, cli_binary, run_cli, secrets_in
from tests.claude_code import stop_tree
from tests.claude_code_relay import relay_serving
from tests.fake_gemini import FakeGemini, Text, ToolUse, content_texts, function_names, function_responses
from tests.processes import REGISTER, ServeProcess, call_tool_sync, run_relay

ANNOUNCE_WITHIN_S = WAKE_BOUND_S
NOTE = "Review done: ship PR 12 once the changelog names the flag."
MODEL = ("-m", "gemini-2.5-flash")
"""A model named on the command line: Gemini CLI's automatic routing asks the model first otherwise."""
RELAY_FUNCTIONS = {f"mcp_relay_{name}" for name in AGENT_TOOLS}


def _suffix() -> str:
    return str(time.monotonic_ns())[-7:]


def _setup(folder: Path, url: str, agent: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return run_relay(
        "setup", "gemini", "--url", url, "--agent", agent, "--redis-url", redis_url, "--dir", folder
    )


# --- the file ------------------------------------------------------------------------------------------


def test_setup_writes_variable_headers_and_the_hook_and_no_secret(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 0, done.stderr
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    server = settings["mcpServers"]["relay"]
    assert server["httpUrl"] == "http://127.0.0.1:9/mcp/agent"
    assert server["headers"] == {
        "Authorization": "${RELAY_AUTHORIZATION}",
        "X-CSF-Agent-ID": "${RELAY_AGENT_ID}",
        "X-CSF-Session-ID": "${RELAY_SESSION_ID}",
    }
    (hook,) = [h for group in settings["hooks"]["AfterAgent"] for h in group["hooks"]]
    assert " hook after-turn --credential-file " in hook["command"] and "--key-file" not in hook["command"]
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []
    assert "/.relay/credential" in (folder / ".gitignore").read_text()
    assert "cannot be refreshed" in done.stdout and "15 minutes" in done.stdout
    assert "cannot be woken while idle" in done.stdout


def test_rerunning_keeps_the_users_servers_and_hooks(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    (folder / ".gemini").mkdir(parents=True)
    mine = {"type": "command", "command": "echo mine"}
    (folder / SETTINGS_FILE).write_text(
        json.dumps(
            {
                "theme": "dark",
                "mcpServers": {"docs": {"httpUrl": "http://x"}},
                "hooks": {"AfterAgent": [{"hooks": [mine]}]},
            }
        )
    )
    agent = f"author-{_suffix()}"

    assert _setup(folder, "http://127.0.0.1:9", agent, redis_url).returncode == 0
    assert _setup(folder, "http://127.0.0.1:8", agent, redis_url).returncode == 0

    settings = json.loads((folder / SETTINGS_FILE).read_text())
    assert settings["theme"] == "dark" and settings["mcpServers"]["docs"] == {"httpUrl": "http://x"}
    assert settings["mcpServers"]["relay"]["httpUrl"] == "http://127.0.0.1:8/mcp/agent"
    hooks = [h for group in settings["hooks"]["AfterAgent"] for h in group["hooks"]]
    assert hooks[0] == mine and len(hooks) == 2


@pytest.mark.parametrize(
    ("content", "says"),
    [("{not json", "is not valid JSON"), ('{"mcpServers": []}', "'mcpServers' is not a JSON object")],
)
def test_a_file_gemini_would_not_read_is_refused_and_nothing_is_written(
    tmp_path: Path, redis_url: str, content: str, says: str
) -> None:
    folder = tmp_path / "author"
    (folder / ".gemini").mkdir(parents=True)
    (folder / SETTINGS_FILE).write_text(content)

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in folder.rglob("*")) == [".gemini", "settings.json"]


def test_run_without_a_set_up_folder_says_what_to_do(tmp_path: Path) -> None:
    done = run_relay("run", "--dir", tmp_path, "--command", "/bin/true", "gemini", "mcp", "list")

    assert done.returncode == 2 and "relay setup gemini" in done.stderr and "Traceback" not in done.stderr


# --- the real CLI ------------------------------------------------------------------------------------------


@dataclass
class GeminiWorld:
    binary: Path
    tmp: Path
    serve: ServeProcess
    key: Path
    api: FakeGemini
    redis_url: str

    def folder(self, name: str) -> tuple[Path, str, dict[str, str]]:
        """A folder set up for a new agent, trusted in a fresh ``HOME``; its agent id and environment."""
        folder, home, agent = self.tmp / name, self.tmp / f"{name}-home", f"{name}-{_suffix()}"
        done = _setup(folder, self.serve.url, agent, self.redis_url)
        assert done.returncode == 0, done.stderr
        (home / ".gemini").mkdir(parents=True)
        user = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": True}},
            "general": {"disableAutoUpdate": True},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        (home / ".gemini" / "settings.json").write_text(json.dumps(user))
        (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(folder): "TRUST_FOLDER"}))
        env = clean_environment(
            home, {"GEMINI_API_KEY": "offline", "GOOGLE_GEMINI_BASE_URL": self.api.base_url}
        )
        return folder, agent, env

    def relay_run(self, folder: Path, env: dict[str, str], *args: str) -> list[str]:
        return [*_relay(), "run", "--dir", str(folder), "--command", str(self.binary), "gemini", *args]


def _relay() -> list[str]:
    import sys

    return [sys.executable, "-m", "relay"]


@pytest.fixture(scope="module")
def gemini_world(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GeminiWorld]:
    binary = cli_binary("@google/gemini-cli", "gemini")
    tmp = tmp_path_factory.mktemp("gemini")
    with relay_serving(tmp, redis_url) as (serve, key), FakeGemini() as api:
        yield GeminiWorld(binary, tmp, serve, key, api, redis_url)


def _send(world: GeminiWorld, to: str, text: str) -> float:
    sender = f"reviewer-{_suffix()}"
    headers = agent_headers(load_key_file(world.key), sender, "s1", 600)
    call_tool_sync(world.serve.url, headers, "RegisterAgentAddress", REGISTER)
    call_tool_sync(
        world.serve.url, headers, "SendAgentMessage", {"to": to, "message": {"kind": "note", "text": text}}
    )
    return time.monotonic()


def _responses(requests: list[Any]) -> str:
    return json.dumps([r for q in requests for r in function_responses(q)])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mcp_list_connects_and_a_turn_registers_and_fetches_the_note(gemini_world: GeminiWorld) -> None:
    world, api = gemini_world, gemini_world.api
    folder, agent, env = world.folder("author")

    listing = run_cli(world.relay_run(folder, env, "mcp", "list"), folder, env)
    _send(world, agent, NOTE)  # the launcher registered the agent: the note waits in its inbox
    api.reply(
        ToolUse("mcp_relay_RegisterAgentAddress", {"provider": "claudecode", "endpoint": "127.0.0.1:14111"})
    )
    api.reply(ToolUse("mcp_relay_FetchAgentInbox", {}))
    api.reply(Text("Read the review."))
    first = len(api.requests)
    turn = run_cli(
        world.relay_run(folder, env, "--yolo", *MODEL, "-p", "register, then read your inbox"), folder, env
    )

    shown = listing.stdout + listing.stderr  # gemini mcp list prints to stderr
    assert f"✓ relay: {world.serve.url}" in shown and "(http) - Connected" in shown, shown
    assert turn.returncode == 0, turn.stderr[-3000:]
    turns = [r for r in api.requests[first:] if r.is_conversation]
    assert function_names(turns[0]) >= RELAY_FUNCTIONS
    results = _responses(turns)
    assert "registered_at" in results and "superseded" not in results
    assert NOTE in results  # the structured result reaches the model (as text in <untrusted_context>)
    assert "token expires in 15 min" in turn.stderr
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mail_arriving_during_a_turn_is_announced_when_it_ends(gemini_world: GeminiWorld) -> None:
    world, api = gemini_world, gemini_world.api
    folder, agent, env = world.folder("reviewer")
    api.reply(Text("Working on it."))
    api.reply(ToolUse("mcp_relay_FetchAgentInbox", {}))
    api.reply(Text("Read the review."))
    first = len(api.requests)
    api.hold()
    proc = subprocess.Popen(
        world.relay_run(folder, env, "--yolo", *MODEL, "-p", "work on the release"),
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
        _send(world, agent, NOTE)  # while the model is still working
        ended = time.monotonic()
        api.release()
        announced = api.wait_for(
            lambda r: r.is_conversation and any(f"new message for {agent}" in t for t in content_texts(r)),
            60,
            after=first,
            what="carrying relay's summary (the AfterAgent hook)",
        )
        fetched = api.wait_for(
            lambda r: NOTE in _responses([r]), 60, after=first, what="with the fetched note"
        )
        _, err = proc.communicate(timeout=120)
    finally:
        api.release()
        stop_tree(proc)

    took = announced.at - ended
    assert took < ANNOUNCE_WITHIN_S, f"announced {took:.2f} s after the turn's model answer"
    assert proc.returncode == 0, err[-3000:]
    assert fetched.at >= announced.at
    summary = "\n".join(content_texts(announced))
    assert "from reviewer-" in summary and "Call FetchAgentInbox" in summary
