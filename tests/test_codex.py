"""``relay setup codex`` and Codex 0.171 itself, offline: the setup's files (merging, refusals, no
secret), then the real CLI against a real ``relay serve`` and a fake Responses API on loopback.

The slow tests share one Codex ``HOME`` with its ``codex app-server`` daemon (the shared daemon
interactive sessions run in; ``codex exec --remote unix://`` runs a turn there too, so a test drives
the same process that runs the helper and the hooks). The user's one step, trusting the folder and its
hooks, is written into the user config as Codex writes it (``[projects."DIR"]``, ``[hooks.state."KEY"]
trusted_hash`` from the app server's ``hooks/list``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from relay import credential_file
from relay.codex.setup import CONFIG_FILE, HOOKS_FILE, session_id
from relay.folder_setup import FolderRequest
from tests.agent_clis import (
    AGENT_TOOLS,
    ROOT,
    WAKE_BOUND_S,
    clean_environment,
    cli_binary,
    run_cli,
    secrets_in,
)
from tests.claude_code import stop_tree
from tests.claude_code_relay import relay_serving
from tests.fake_responses import FakeResponses, Recorded, Text, ToolUse, input_texts, tool_outputs
from tests.processes import REGISTER, ServeProcess, call_tool_sync, run_relay

WAKE_WITHIN_S = WAKE_BOUND_S
NOTE = "Review done: ship PR 12 once the changelog names the flag."
RELAY_TOOLS = set(AGENT_TOOLS)


def _suffix() -> str:
    return str(time.monotonic_ns())[-7:]


def _setup(folder: Path, url: str, agent: str, redis_url: str, env: dict[str, str] | None = None) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    return run_relay(
        "setup", "codex", "--url", url, "--agent", agent, "--redis-url", redis_url, "--dir", folder, env=env
    )


# --- the files -----------------------------------------------------------------------------------------


def test_setup_writes_the_server_and_hooks_and_no_secret(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 0, done.stderr
    config = tomllib.loads((folder / CONFIG_FILE).read_text())
    server = config["mcp_servers"]["relay"]
    assert server["url"] == "http://127.0.0.1:9/mcp/agent"
    assert " hook headers --credential-file " in server["http_headers_helper"]
    assert (
        "--session codex-" in server["http_headers_helper"]
        and "--key-file" not in server["http_headers_helper"]
    )
    hooks = json.loads((folder / HOOKS_FILE).read_text())["hooks"]
    assert set(hooks) == {"SessionStart", "SessionEnd"}
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []
    assert (folder / ".relay" / "credential").stat().st_mode & 0o777 == 0o600
    ignored = (folder / ".gitignore").read_text()
    assert "/.relay/credential" in ignored and f"/{CONFIG_FILE}" in ignored
    assert "Trust all and continue" in done.stdout and "nothing answers at" in done.stdout


def test_rerunning_keeps_the_users_entries_and_replaces_relays(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    (folder / ".codex").mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(
        '# mine\nmodel = "o3"\n\n[mcp_servers.docs]\nurl = "http://127.0.0.1:7/mcp"\n'
    )
    mine = {"type": "command", "command": "echo mine"}
    (folder / HOOKS_FILE).write_text(json.dumps({"hooks": {"Stop": [{"hooks": [mine]}]}}))
    agent = f"author-{_suffix()}"

    first = _setup(folder, "http://127.0.0.1:9", agent, redis_url)
    second = _setup(folder, "http://127.0.0.1:8", agent, redis_url)

    assert first.returncode == 0 and second.returncode == 0, second.stderr
    text = (folder / CONFIG_FILE).read_text()
    assert text.startswith('# mine\nmodel = "o3"\n') and text.count("[mcp_servers.relay]") == 1
    config = tomllib.loads(text)
    assert config["mcp_servers"]["docs"] == {"url": "http://127.0.0.1:7/mcp"}
    assert config["mcp_servers"]["relay"]["url"] == "http://127.0.0.1:8/mcp/agent"
    hooks = json.loads((folder / HOOKS_FILE).read_text())["hooks"]
    assert hooks["Stop"] == [{"hooks": [mine]}]
    assert len(hooks["SessionStart"]) == 1 and len(hooks["SessionEnd"]) == 1
    assert "revoked the folder's previous credential" in second.stdout


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        (CONFIG_FILE, "[mcp_servers.relay\nurl = 1\n", "is not valid TOML"),
        (CONFIG_FILE, 'mcp_servers = { relay = { url = "x" } }\n', "in a form relay does not edit"),
        (HOOKS_FILE, "[1, 2]", "is not a JSON object"),
        (HOOKS_FILE, '{"hooks": {"SessionStart": {}}}', "hooks.SessionStart is not a list"),
    ],
)
def test_a_file_codex_would_not_read_is_refused_and_nothing_is_written(
    tmp_path: Path, redis_url: str, name: str, content: str, says: str
) -> None:
    folder = tmp_path / "author"
    (folder / ".codex").mkdir(parents=True)
    (folder / name).write_text(content)
    before = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == before
    assert (folder / name).read_text() == content


# --- the real CLI ------------------------------------------------------------------------------------------


@dataclass
class CodexWorld:
    binary: Path
    home: Path
    serve: ServeProcess
    key: Path
    api: FakeResponses
    redis_url: str

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def env(self) -> dict[str, str]:
        return clean_environment(self.home, {"CODEX_HOME": str(self.codex_home), "FAKE_KEY": "offline"})

    def codex(self, cwd: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return run_cli([str(self.binary), *args], cwd, self.env(), timeout)

    def folder(self, name: str) -> Path:
        """A project folder the user trusted (trusted before the daemon started: it reads project trust
        when it starts)."""
        folder = self.home.parent / "projects" / name
        assert folder.is_dir(), f"{name} is not one of PROJECTS"
        return folder

    def trust(self, folder: Path) -> None:
        """What the user's answers write: the project trusted, its hooks (their current hashes), and relay's
        tools approved (Codex asks before each MCP call otherwise)."""
        with (folder / CONFIG_FILE).open("a") as project:  # relay's table is the last: its tools approved
            project.write('default_tools_approval_mode = "approve"\n')
        entries = []
        for hook in self.hooks_of(folder):
            entries.append(f'\n[hooks.state."{hook["key"]}"]\ntrusted_hash = "{hook["currentHash"]}"\n')
        with (self.codex_home / "config.toml").open("a") as config:
            config.write("".join(entries))

    def hooks_of(self, folder: Path) -> list[dict[str, Any]]:
        """The app server's ``hooks/list`` for ``folder`` (a stdio ``codex app-server`` of its own)."""
        requests = [
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"clientInfo": {"name": "relay-tests", "version": "1"}},
            },
            {"jsonrpc": "2.0", "method": "initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "hooks/list", "params": {"cwds": [str(folder)]}},
        ]
        proc = subprocess.Popen(
            [str(self.binary), "app-server"],
            cwd=folder,
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        found: list[dict[str, Any]] = []
        timer = threading.Timer(60, stop_tree, [proc.pid])
        timer.start()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
            proc.stdin.flush()
            for line in proc.stdout:
                answer = json.loads(line)
                if answer.get("id") == 2:
                    found = [h for entry in answer["result"]["data"] for h in entry["hooks"]]
                    break
        finally:
            timer.cancel()
            stop_tree(proc)
        return found


PROJECTS = ("author", "other")


def _user_config(api: FakeResponses, projects: Path) -> str:
    trusted = "".join(f'\n[projects."{projects / name}"]\ntrust_level = "trusted"\n' for name in PROJECTS)
    return (
        f"""model = "fake-model"
model_provider = "fake"
approval_policy = "never"

[model_providers.fake]
name = "fake"
base_url = "{api.base_url}/v1"
wire_api = "responses"
env_key = "FAKE_KEY"
"""
        + trusted
    )


@pytest.fixture(scope="module")
def codex_world(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodexWorld]:
    binary = cli_binary("@openai/codex", "codex")
    tmp = tmp_path_factory.mktemp("codex")
    with relay_serving(tmp, redis_url) as (serve, key), FakeResponses() as api:
        home = tmp / "home"
        (home / ".codex").mkdir(parents=True)
        for name in PROJECTS:
            (tmp / "projects" / name).mkdir(parents=True)
        (home / ".codex" / "config.toml").write_text(_user_config(api, tmp / "projects"))
        world = CodexWorld(binary, home, serve, key, api, redis_url)
        started = world.codex(tmp / "projects" / PROJECTS[0], "app-server", "daemon", "start", timeout=180)
        assert started.returncode == 0, started.stdout + started.stderr
        pids = {int(p) for p in re.findall(r'"pid":\s*(\d+)', started.stdout + started.stderr)}
        try:
            yield world
        finally:
            world.codex(home, "app-server", "daemon", "stop", timeout=60)
            for pid in pids:
                stop_tree(pid)


def _send(world: CodexWorld, to: str, text: str) -> float:
    """Another agent sends ``text`` to ``to``; when (monotonic) the send was answered."""
    sender = f"reviewer-{_suffix()}"
    headers = agent_headers(load_key_file(world.key), sender, "s1", 600)
    call_tool_sync(world.serve.url, headers, "RegisterAgentAddress", REGISTER)
    call_tool_sync(
        world.serve.url, headers, "SendAgentMessage", {"to": to, "message": {"kind": "note", "text": text}}
    )
    return time.monotonic()


def _json_in(output: Any) -> Any:
    """The JSON object Codex put in a tool output (a string, or its last text part)."""
    text = output if isinstance(output, str) else output[-1]["text"]
    return json.loads(text[text.index("{") :])


def _relay_tools(recorded: Recorded) -> set[str]:
    namespaces = [t for t in recorded.body.get("tools") or [] if t.get("name") == "mcp__relay"]
    return {tool["name"] for ns in namespaces for tool in ns.get("tools", [])}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_codex_session_registers_fetches_and_is_woken_by_mail(
    codex_world: CodexWorld, tmp_path: Path, store: redis.Redis
) -> None:
    world, api = codex_world, codex_world.api
    agent = f"author-{_suffix()}"
    folder = world.folder("author")
    done = _setup(folder, world.serve.url, agent, world.redis_url, env={"PATH": world.env()["PATH"]})
    assert done.returncode == 0, done.stderr
    world.trust(folder)
    register = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
    api.reply(ToolUse("mcp__relay.RegisterAgentAddress", register), ToolUse("mcp__relay.FetchAgentInbox", {}))
    api.reply(Text("Registered; nothing to read."))
    first = len(api.requests)

    turn = world.codex(folder, "exec", "--remote", "unix://", "register, then read your inbox")

    assert turn.returncode == 0, turn.stdout + turn.stderr
    thread = re.search(r"(?:session|thread) id: (\S+)", turn.stdout + turn.stderr)
    assert thread is not None, turn.stderr
    turns = [r for r in api.requests[first:] if r.is_conversation]
    assert _relay_tools(turns[0]) == RELAY_TOOLS, turn.stderr[-3000:]  # all of them, in one namespace
    outputs = [o for r in turns for o in tool_outputs(r)]
    registered_out, fetched_out = json.dumps(outputs[0]["output"]), json.dumps(outputs[-1]["output"])
    assert "registered_at" in registered_out and "superseded" not in registered_out
    assert '\\"envelopes\\": []' in fetched_out.replace('\\"envelopes\\":[]', '\\"envelopes\\": []')
    # one relay session for the folder: the waiter's registration (the hooks) and the model's calls (the
    # helper, run in the shared daemon) name the same one, derived from the folder
    expected = session_id(FolderRequest(folder, agent, world.serve.url, ()))
    assert store.hget(Keys().registration(agent), "session") == expected
    assert _json_in(outputs[0]["output"])["session"] == expected

    # idle now: the waiter the SessionStart hook started is blocked on relay's wait
    api.reply(ToolUse("mcp__relay.FetchAgentInbox", {}))
    api.reply(Text("Read the review."))
    woken_from = len(api.requests)
    sent = _send(world, agent, NOTE)
    woken = api.wait_for(
        lambda r: r.is_conversation and any(f"new message for {agent}" in t for t in input_texts(r)),
        30,
        after=woken_from,
        what="carrying relay's summary (codex queue)",
    )
    fetched = api.wait_for(
        lambda r: any(NOTE in json.dumps(o["output"]) for o in tool_outputs(r)),
        30,
        after=woken_from,
        what="with the fetched note in the tool result",
    )

    took = woken.at - sent
    assert took < WAKE_WITHIN_S, f"woken {took:.2f} s after the send"
    assert any("from reviewer-" in t for t in input_texts(woken))
    assert (
        secrets_in(folder, [json.loads((folder / ".relay" / "credential").read_text())["credential"]]) == []
    )
    assert fetched.at >= woken.at


def test_session_end_stops_the_sessions_waiter(tmp_path: Path) -> None:
    credential = tmp_path / "author" / ".relay" / "credential"
    url = "http://127.0.0.1:9/mcp/agent"  # nothing answers: the waiter retries quietly meanwhile
    credential_file.write(credential, credential_file.CredentialFile(url, "author", "cr_" + "a" * 20 + ".x"))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("XDG_RUNTIME_DIR", None)
    session = ("--credential-file", str(credential), "--session", "codex-0123456789abcdef")
    relay = [sys.executable, "-m", "relay", "hook"]
    waiter = subprocess.Popen(
        [
            *relay,
            "codex-wait",
            *session,
            "--thread",
            "01a23a96-14ae-7193-b883-dce3c4cc4345",
            "--codex",
            "false",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = tmp_path / f"relay-{os.getuid()}" / "author.codex-0123456789abcdef.waiter"
        wait_until(
            lambda: lock.exists() and lock.read_text().strip() == str(waiter.pid),
            30,
            "the waiter holds its slot",
        )

        ended = subprocess.run(
            [*relay, "codex", *session],
            input=json.dumps(
                {"hook_event_name": "SessionEnd", "session_id": "01a23a96-14ae-7193-b883-dce3c4cc4345"}
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert ended.returncode == 0 and ended.stdout == "", ended.stderr
        assert waiter.wait(30) == 0
    finally:
        stop_tree(waiter)
