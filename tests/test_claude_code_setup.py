"""``relay setup claude-code``: the files it writes, merging and idempotence, bad input, git hygiene.
Each run issues a credential in the test run's Redis (``--redis-url``); what the credential does
through a real relay is in ``test_agent_credentials.py``.

The real client reading these files is in ``test_claude_code_client.py`` and ``test_claude_code_wake.py``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relay.claude_code.setup import HOOK_EVENTS, HOOK_TIMEOUT_S, WAITER_TIMEOUT_S
from relay.cli import main

URL = "http://127.0.0.1:8080/mcp/agent"


Relay = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def relay(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Relay:
    """``relay ARGS`` in this process: the same command line as a child's, in milliseconds instead of
    the seconds a new interpreter takes to import every command."""
    monkeypatch.delenv("RELAY_DATA_DIR", raising=False)

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["relay", *map(str, args)], code, out, err)

    return run


@pytest.fixture
def store(redis_url: str) -> str:
    return redis_url


def _setup(relay: Relay, folder: Path, store: str, agent: str = "author") -> subprocess.CompletedProcess[str]:
    return relay(
        "setup", "claude-code", "--url", URL, "--agent", agent, "--redis-url", store, "--dir", folder
    )


def _credential(folder: Path) -> dict[str, str]:
    path = folder / ".relay" / "credential"
    assert path.stat().st_mode & 0o777 == 0o600
    found: dict[str, str] = json.loads(path.read_text())
    return found


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _ours(settings: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [
        h for group in settings["hooks"].get(event, []) for h in group["hooks"] if "hook wait" in h["command"]
    ]


def test_a_fresh_folder_gets_the_server_the_hooks_and_the_approval(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "author"
    folder.mkdir()

    done = _setup(relay, folder, store)

    assert done.returncode == 0, done.stderr
    server = _json(folder / ".mcp.json")["mcpServers"]["relay"]
    assert server["type"] == "http" and server["url"] == URL
    credential = folder / ".relay" / "credential"
    assert server["headersHelper"].endswith(
        f"hook headers --credential-file {credential} --claude-pid $PPID"
    ), server
    assert _credential(folder)["agent"] == "author" and _credential(folder)["url"] == URL
    assert "headers" not in server and "Bearer" not in (folder / ".mcp.json").read_text()
    settings = _json(folder / ".claude" / "settings.local.json")
    for event in HOOK_EVENTS:
        (hook,) = _ours(settings, event)
        assert hook["type"] == "command" and hook["asyncRewake"] is True
        assert hook["timeout"] == HOOK_TIMEOUT_S and f"--timeout {WAITER_TIMEOUT_S}" in hook["command"]
        assert f"hook wait --credential-file {credential} --timeout" in hook["command"]
        assert hook["command"].endswith("--claude-pid $PPID")
    assert settings["enabledMcpjsonServers"] == ["relay"]
    assert "Bearer" not in (folder / ".claude" / "settings.local.json").read_text()
    out = done.stdout
    assert "no token is stored in any file" in out
    assert "trust" in out and "headersHelper not run" in out and "✔ Connected" in out
    assert f"warning: nothing answers at {URL}" in out  # no relay serves the URL in this test
    assert "becomes reachable when its Claude Code" in out


def test_it_merges_into_existing_files_and_a_rerun_changes_nothing_more(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "author"
    (folder / ".claude").mkdir(parents=True)
    other_server = {"type": "stdio", "command": "other-mcp"}
    (folder / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": other_server}, "x": 1}))
    other_hook = {"type": "command", "command": "echo theirs"}
    (folder / ".claude" / "settings.local.json").write_text(
        json.dumps(
            {
                "hooks": {
                    "Stop": [{"hooks": [other_hook]}],
                    "PreToolUse": [{"matcher": "Bash", "hooks": [other_hook]}],
                },
                "enabledMcpjsonServers": ["other"],
                "permissions": {"allow": ["Bash(ls)"]},
            }
        )
    )

    assert _setup(relay, folder, store).returncode == 0
    first = ((folder / ".mcp.json").read_text(), (folder / ".claude" / "settings.local.json").read_text())
    again = _setup(relay, folder, store)
    assert again.returncode == 0, again.stderr

    assert (
        (folder / ".mcp.json").read_text(),
        (folder / ".claude" / "settings.local.json").read_text(),
    ) == first
    mcp = _json(folder / ".mcp.json")
    assert mcp["mcpServers"]["other"] == other_server and mcp["x"] == 1
    settings = _json(folder / ".claude" / "settings.local.json")
    assert {"hooks": [other_hook]} in settings["hooks"]["Stop"]
    assert settings["hooks"]["PreToolUse"] == [{"matcher": "Bash", "hooks": [other_hook]}]
    assert settings["enabledMcpjsonServers"] == ["other", "relay"]
    assert settings["permissions"] == {"allow": ["Bash(ls)"]}
    assert all(len(_ours(settings, event)) == 1 for event in HOOK_EVENTS)
    assert "updated .mcp.json" in again.stdout


def test_a_rerun_with_another_agent_replaces_relays_entries(tmp_path: Path, store: str, relay: Relay) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    assert _setup(relay, folder, store, agent="author").returncode == 0

    assert _setup(relay, folder, store, agent="reviewer").returncode == 0

    assert _credential(folder)["agent"] == "reviewer"
    settings = _json(folder / ".claude" / "settings.local.json")
    for event in HOOK_EVENTS:
        (hook,) = _ours(settings, event)
        assert "--credential-file" in hook["command"]


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        (".mcp.json", "{not json", "cannot be read as JSON"),
        (".mcp.json", "[1, 2]", "is not a JSON object"),
        (".mcp.json", '{"mcpServers": []}', "'mcpServers' is not a JSON object"),
        (".claude/settings.local.json", '{"hooks": {"Stop": {}}}', "hooks.Stop is not a list"),
        (".claude/settings.local.json", '{"enabledMcpjsonServers": "relay"}', "is not a list"),
    ],
)
def test_a_file_it_cannot_read_as_claude_code_does_changes_nothing(
    tmp_path: Path, store: str, relay: Relay, name: str, content: str, says: str
) -> None:
    folder = tmp_path / "folder"
    (folder / ".claude").mkdir(parents=True)
    (folder / name).write_text(content)
    before = sorted(p.name for p in folder.rglob("*"))

    done = _setup(relay, folder, store)

    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
    assert (folder / name).read_text() == content
    assert sorted(p.name for p in folder.rglob("*")) == before


def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = [
        (("--url", "ftp://x", "--agent", "a", "--redis-url", store), "not an http(s) URL"),
        (("--url", URL, "--agent", "Bad Agent", "--redis-url", store), "agent"),
        (("--url", URL, "--agent", "a", "--redis-url", "http://x"), "not a Redis URL"),
        (
            ("--url", URL, "--agent", "a", "--redis-url", store, "--dir", str(tmp_path / "nope")),
            "not a folder",
        ),
    ]
    for args, says in cases:
        done = (
            relay("setup", "claude-code", *args, "--dir", folder)
            if "--dir" not in args
            else relay("setup", "claude-code", *args)
        )
        assert done.returncode != 0 and says in done.stderr, (args, done.stderr)
    assert list(folder.iterdir()) == []


def test_without_a_running_relay_it_says_so_and_writes_nothing(
    tmp_path: Path, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, data = tmp_path / "folder", tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("RELAY_DATA_DIR", str(data))

    missing = relay("setup", "claude-code", "--url", URL, "--agent", "a", "--dir", folder)

    assert missing.returncode == 2 and "relay is not running here" in missing.stderr, missing.stderr
    assert list(folder.iterdir()) == []


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
    ).stdout


def test_in_a_git_work_tree_the_files_it_creates_are_ignored_and_git_status_shows_no_secret(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    _git(folder, "init", "-q")

    done = _setup(relay, folder, store)

    assert done.returncode == 0, done.stderr
    assert ".gitignore now ignores .mcp.json, .claude/settings.local.json, .relay/credential" in done.stdout
    assert _git(folder, "status", "--porcelain", "--untracked-files=all").split() == ["??", ".gitignore"]
    assert "Bearer" not in (folder / ".gitignore").read_text()
    assert _credential(folder)["credential"] not in _git(folder, "status", "--porcelain", "--ignored")


def test_a_tracked_mcp_json_is_merged_and_noted_and_nothing_else_is_ignored(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    _git(folder, "init", "-q")
    (folder / ".mcp.json").write_text('{"mcpServers": {}}')
    _git(folder, "add", ".mcp.json")

    done = _setup(relay, folder, store)

    assert "note: .mcp.json is tracked by git" in done.stdout
    assert (folder / ".gitignore").read_text().splitlines()[1:] == [
        "/.claude/settings.local.json",
        "/.relay/credential",
    ]


def test_a_folder_that_is_also_relays_data_dir_is_warned_about(
    tmp_path: Path, store: str, relay: Relay
) -> None:
    folder = tmp_path / "repo"
    (folder / ".relay").mkdir(parents=True)
    assert relay("keygen", folder / ".relay" / "relay.key").returncode == 0

    done = _setup(relay, folder, store)

    assert done.returncode == 0
    assert f"warning: {folder} is also a relay data dir: its relay.key (relay's master key)" in done.stdout
    assert "relay.key" not in (folder / ".mcp.json").read_text()
