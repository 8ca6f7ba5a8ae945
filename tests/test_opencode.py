"""``relay setup opencode`` and opencode 1.18.33 itself, offline: the setup's files (merging, refusal, no
secret), then the real CLI (``scripts/install-clis``) against a real ``relay serve`` and the
chat-completions fake (an ``@ai-sdk/openai-compatible`` provider the user's config names), in a fresh
``HOME``. The wake test runs ``opencode serve`` on loopback, which loads the project plugin like the TUI
does, and creates the session over its HTTP API (what the TUI does at start), so no terminal is needed.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from relay.opencode.setup import CONFIG_FILE, PLUGIN_FILE
from tests.agent_clis import INSTALL_DIR, WAKE_BOUND_S, clean_environment, cli_binary, run_cli, secrets_in
from tests.claude_code import stop_tree
from tests.claude_code_relay import relay_serving
from tests.fake_openai import FakeOpenAI, Recorded, Text, ToolUse, tool_results
from tests.front_support import free_port
from tests.processes import REGISTER, ServeProcess, call_tool_sync, run_relay

WAKE_WITHIN_S = WAKE_BOUND_S
NOTE = "Review done: ship PR 12 once the changelog names the flag."
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


def _suffix() -> str:
    return str(time.monotonic_ns())[-7:]


def _setup(folder: Path, url: str, agent: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return run_relay(
        "setup", "opencode", "--url", url, "--agent", agent, "--redis-url", redis_url, "--dir", folder
    )


# --- the files -----------------------------------------------------------------------------------------


def test_setup_writes_the_server_and_the_plugin_and_no_secret(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({"theme": "dark", "mcp": {"docs": {"type": "local"}}}))

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 0, done.stderr
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config["theme"] == "dark" and config["mcp"]["docs"] == {"type": "local"}
    assert config["mcp"]["relay"] == {
        "type": "remote",
        "url": "http://127.0.0.1:9/mcp/agent",
        "oauth": False,
        "enabled": True,
    }
    plugin = (folder / PLUGIN_FILE).read_text()
    assert json.dumps(str(folder / ".relay" / "credential")) in plugin and "__RELAY_ARGV__" not in plugin
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []
    assert "opencode asks nothing more" in done.stdout


def test_a_malformed_opencode_json_is_refused_and_nothing_is_written(tmp_path: Path, redis_url: str) -> None:
    folder = tmp_path / "author"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text('{"mcp": "relay"}')

    done = _setup(folder, "http://127.0.0.1:9", f"author-{_suffix()}", redis_url)

    assert done.returncode == 2 and "'mcp' is not a JSON object" in done.stderr, done.stderr
    assert sorted(p.name for p in folder.rglob("*")) == [CONFIG_FILE]


# --- the real CLI ------------------------------------------------------------------------------------------


def _binary() -> Path:
    cli_binary("opencode-ai", "opencode")  # skips unless the pinned package is installed
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    return INSTALL_DIR / "node_modules" / f"opencode-{platform.system().lower()}-{arch}" / "bin" / "opencode"


@dataclass
class OpencodeWorld:
    binary: Path
    tmp: Path
    serve: ServeProcess
    key: Path
    api: FakeOpenAI
    redis_url: str

    def folder(self, name: str) -> tuple[Path, str, dict[str, str]]:
        """A folder set up for a new agent, whose user config names the fake model; its environment."""
        folder, agent = self.tmp / name, f"{name}-{_suffix()}"
        done = _setup(folder, self.serve.url, agent, self.redis_url)
        assert done.returncode == 0, done.stderr
        config = json.loads((folder / CONFIG_FILE).read_text())
        config["model"] = "fake/fake-model"
        config["provider"] = {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "fake",
                "options": {"baseURL": self.api.base_url + "/v1", "apiKey": "offline"},
                "models": {"fake-model": {"name": "fake-model"}},
            }
        }
        (folder / CONFIG_FILE).write_text(json.dumps(config))
        env = clean_environment(self.tmp / f"{name}-home", {"OPENCODE_DISABLE_AUTOUPDATE": "1"})
        return folder, agent, env


@pytest.fixture(scope="module")
def opencode_world(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeWorld]:
    binary = _binary()
    tmp = tmp_path_factory.mktemp("opencode")
    with relay_serving(tmp, redis_url) as (serve, key), FakeOpenAI() as api:
        yield OpencodeWorld(binary, tmp, serve, key, api, redis_url)


def _send(world: OpencodeWorld, to: str, text: str) -> float:
    headers = agent_headers(load_key_file(world.key), f"reviewer-{_suffix()}", "s1", 600)
    call_tool_sync(world.serve.url, headers, "RegisterAgentAddress", REGISTER)
    call_tool_sync(
        world.serve.url, headers, "SendAgentMessage", {"to": to, "message": {"kind": "note", "text": text}}
    )
    return time.monotonic()


def _results(requests: list[Recorded]) -> str:
    return json.dumps([r for q in requests for r in tool_results(q)])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback, the test's own server
            return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mcp_list_connects_with_the_plugins_headers(opencode_world: OpencodeWorld) -> None:
    world = opencode_world
    folder, _, env = world.folder("lister")

    listing = run_cli([str(world.binary), "mcp", "list"], folder, env)

    assert "✓ relay" in listing.stdout and "connected" in listing.stdout, listing.stdout + listing.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mail_wakes_an_idle_session_which_registers_and_fetches_it(opencode_world: OpencodeWorld) -> None:
    world, api = opencode_world, opencode_world.api
    folder, agent, env = world.folder("author")
    port = free_port()
    server = subprocess.Popen(
        [str(world.binary), "serve", "--hostname", "127.0.0.1", "--port", str(port)],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{base}/session"), 60, "opencode serve answers")
        created = urllib.request.Request(  # noqa: S310 - loopback
            f"{base}/session", data=b"{}", method="POST", headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(created, timeout=30) as answer:  # noqa: S310 - loopback
            session = json.loads(answer.read())["id"]
        wait_until(lambda: _registered(world, agent), 60, f"the plugin's waiter registered {agent}")
        api.reply(
            ToolUse("relay_RegisterAgentAddress", {"provider": "claudecode", "endpoint": "127.0.0.1:14111"})
        )
        api.reply(ToolUse("relay_FetchAgentInbox", {}))
        api.reply(Text("Read the review."))
        first = len(api.requests)
        sent = _send(world, agent, NOTE)
        woken = api.wait_for(
            lambda r: r.is_conversation and f"new message for {agent}" in r.text(),
            30,
            after=first,
            what="carrying relay's summary (promptAsync)",
        )
        fetched = api.wait_for(lambda r: NOTE in _results([r]), 60, after=first, what="with the fetched note")
    finally:
        stop_tree(server)

    took = woken.at - sent
    after = [(r.path, round(r.at - sent, 2), r.is_conversation) for r in api.requests[first:]]
    assert took < WAKE_WITHIN_S, f"woken {took:.2f} s after the send; requests after it: {after}"
    names = {str(t.get("function", {}).get("name")) for t in woken.body.get("tools") or []}
    assert {"relay_RegisterAgentAddress", "relay_FetchAgentInbox", "relay_SendAgentMessage"} <= names
    assert "registered_at" in _results([fetched]) and "superseded" not in _results([fetched])
    assert session.startswith("ses_")
    credential = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    assert secrets_in(folder, [credential]) == []


def _registered(world: OpencodeWorld, agent: str) -> bool:
    client = redis.Redis.from_url(world.redis_url, decode_responses=True)
    try:
        return bool(client.hget(Keys().registration(agent), "session"))
    finally:
        client.close()
