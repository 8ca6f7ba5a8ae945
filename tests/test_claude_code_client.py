"""Claude Code 2.1.332 itself against a real ``relay serve``, offline: what ``claude mcp list`` says in a
folder set up by ``relay setup claude-code`` (trusted, not trusted, not approved), that a connection
after the token's lifetime still connects, and what Claude Code hands the ``headersHelper`` and the
hooks (the facts ``docs/claude-code.md`` records).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.testing.polling import wait_until
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture, run_claude
from tests.claude_code_relay import mcp_status, read_json, relay_serving, set_up, write_json
from tests.fake_anthropic import FakeAnthropic, Text, ToolUse

__all__ = ["claude_binary_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CONNECTED = "✔ Connected"
STATIC_TOKEN = ("--agent", "author", "--session", "static", "--ttl", "2")


def test_mcp_list_connects_and_connects_again_after_the_token_expired(
    claude_binary: Path, tmp_path: Path, redis_url: str
) -> None:
    folder = tmp_path / "author"
    with relay_serving(tmp_path, redis_url) as (serve, key):
        set_up(folder, serve.url, "author", redis_url)
        mcp = read_json(folder / ".mcp.json")
        mcp["mcpServers"]["relay"]["headersHelper"] += " --ttl 2"  # the helper mints 2 s tokens
        static = subprocess.run(
            [sys.executable, "-m", "relay", "agent-headers", "--key-file", str(key), *STATIC_TOKEN],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        mcp["mcpServers"]["static"] = {"type": "http", "url": serve.url, "headers": json.loads(static.stdout)}
        write_json(folder / ".mcp.json", mcp)
        home = ClaudeHome(tmp_path / "home", trusted=[folder]).write()
        settings = read_json(folder / ".claude" / "settings.local.json")
        settings["enabledMcpjsonServers"].append("static")
        write_json(folder / ".claude" / "settings.local.json", settings)

        first = run_claude(claude_binary, home, folder, "mcp", "list")
        assert mcp_status(first.stdout, "relay") == CONNECTED, first.stdout + first.stderr
        time.sleep(3)  # every token minted so far is past its 2 s lifetime now
        second = run_claude(claude_binary, home, folder, "mcp", "list")

        assert mcp_status(second.stdout, "relay") == CONNECTED, second.stdout + second.stderr
        assert mcp_status(second.stdout, "static").startswith("✘ Failed to connect"), second.stdout
        assert "401" in mcp_status(second.stdout, "static") and "expired" in mcp_status(
            second.stdout, "static"
        )


def test_the_user_trusts_the_folder_once_and_nothing_else_is_asked(
    claude_binary: Path, tmp_path: Path, redis_url: str
) -> None:
    folder = tmp_path / "author"
    with relay_serving(tmp_path, redis_url) as (serve, _key):
        printed = set_up(folder, serve.url, "author", redis_url)
        home = ClaudeHome(tmp_path / "home").write()

        untrusted = run_claude(claude_binary, home, folder, "mcp", "list")
        assert mcp_status(untrusted.stdout, "relay").startswith("⏸ Pending approval"), untrusted.stdout
        approved_by_user = ClaudeHome(
            tmp_path / "home2", settings={"enableAllProjectMcpServers": True}
        ).write()
        not_run = run_claude(claude_binary, approved_by_user, folder, "mcp", "list")
        assert mcp_status(not_run.stdout, "relay") != CONNECTED, not_run.stdout
        assert "headersHelper not run" in not_run.stderr and "no persisted trust" in not_run.stderr

        with FakeAnthropic() as api:  # `claude` in the folder: the trust dialog, answered as setup says
            home.api_url = api.base_url
            with InteractiveClaude(claude_binary, home, folder) as session:
                session.wait_for_text("Yes, I trust this folder", 60)
                assert "headersHelper" in session.screen_text()  # the dialog names what will run
                # "No, exit" is highlighted: down once, then Enter on "Yes", each once the dialog is drawn
                session.wait_quiet(2.0, 60)
                since = session.mark()
                session.type("\x1b[B")
                session.wait_for_text(
                    "\u276f Yes, I trust this folder", 30, since=since
                )  # \u276f: the pointer
                session.wait_quiet(1.0, 30)
                since = session.mark()
                session.type("\r")
                session.wait_for_text("Claude Code v", 60, since=since)
                wait_until(
                    lambda: (
                        read_json(home.root / ".claude.json")["projects"]
                        .get(str(folder), {})
                        .get("hasTrustDialogAccepted")
                    ),
                    60,
                    "the folder is trusted",
                )
        trusted = run_claude(claude_binary, home, folder, "mcp", "list")

        assert mcp_status(trusted.stdout, "relay") == CONNECTED, trusted.stdout + trusted.stderr
        assert "Yes, I trust this folder" in printed and "Pending approval" in printed


def test_without_relays_approval_entry_the_project_server_waits_for_approval(
    claude_binary: Path, tmp_path: Path, redis_url: str
) -> None:
    folder = tmp_path / "author"
    with relay_serving(tmp_path, redis_url) as (serve, _key):
        set_up(folder, serve.url, "author", redis_url)
        settings = read_json(folder / ".claude" / "settings.local.json")
        del settings["enabledMcpjsonServers"]
        write_json(folder / ".claude" / "settings.local.json", settings)
        home = ClaudeHome(tmp_path / "home", trusted=[folder]).write()

        listing = run_claude(claude_binary, home, folder, "mcp", "list")

        assert "Pending approval" in mcp_status(listing.stdout, "relay"), listing.stdout


LOGGER = """#!/bin/sh
# $1: what ran; the rest: the command to run after logging.
what=$1; shift
{ echo "== $what pid=$$ ppid=$PPID"; env | sort; } > "$LOGS/$what-$(date +%s%N).env"
if [ "$what" != helper ]; then cat > "$LOGS/$what-$(date +%s%N).stdin"; fi
exec "$@"
"""


def test_what_claude_code_hands_the_helper_and_the_hooks(
    claude_binary: Path, tmp_path: Path, redis_url: str
) -> None:
    """The helper runs once per connection with no session id in its environment, and again when a call
    is refused with 401 (the call is then retried and succeeds); ``$PPID`` of both is Claude Code."""
    folder, logs = tmp_path / "author", tmp_path / "logs"
    (folder / ".claude").mkdir(parents=True)
    logs.mkdir()
    logger = tmp_path / "log-and-run.sh"
    logger.write_text(LOGGER)
    logger.chmod(0o755)
    with relay_serving(tmp_path, redis_url) as (serve, _key), FakeAnthropic() as api:
        set_up(folder, serve.url, "author", redis_url)  # the credential file; both files rewritten below
        credential = folder / ".relay" / "credential"
        relay = [sys.executable, "-m", "relay", "hook", "headers", "--credential-file", str(credential)]
        helper = f"LOGS={logs} {logger} helper {shlex.join(relay)} --ttl 3 --claude-pid $PPID"
        write_json(
            folder / ".mcp.json",
            {"mcpServers": {"relay": {"type": "http", "url": serve.url, "headersHelper": helper}}},
        )
        hook = {"type": "command", "command": f"LOGS={logs} {logger} hook-$PPID true"}
        write_json(
            folder / ".claude" / "settings.local.json",
            {
                "hooks": {"SessionStart": [{"hooks": [hook]}], "Stop": [{"hooks": [hook]}]},
                "enabledMcpjsonServers": ["relay"],
            },
        )
        register = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
        api.reply(
            ToolUse("mcp__relay__RegisterAgentAddress", register), ToolUse("mcp__relay__FetchAgentInbox", {})
        )
        api.reply(Text("first turn done"))
        api.reply(ToolUse("mcp__relay__FetchAgentInbox", {}))
        api.reply(Text("second turn done"))
        home = ClaudeHome(
            tmp_path / "home",
            api_url=api.base_url,
            trusted=[folder],
            settings={"permissions": {"allow": ["mcp__relay"]}},
        ).write()
        with InteractiveClaude(claude_binary, home, folder, "register, then fetch") as session:
            first = api.wait_for(
                lambda r: '"envelopes"' in r.last_user_text(), 90, what="with the first fetch"
            )
            wait_until(lambda: len(list(logs.glob("hook-*.env"))) >= 2, 30, "the Stop hook ran")
            helper_runs = sorted(logs.glob("helper-*.env"))
            assert len(helper_runs) == 1  # one connection, three requests (initialize, tools/list, calls)
            time.sleep(4)  # the helper's 3 s token is expired now
            before = len(api.requests)
            session.type("fetch again\r")
            after = api.wait_for(
                lambda r: '"envelopes"' in r.last_user_text(), 90, after=before, what="with the second fetch"
            )

            assert "unauthorized" not in after.last_user_text() and "error" not in after.last_user_text()
            assert len(sorted(logs.glob("helper-*.env"))) == 2  # the 401 made Claude Code run it again
            claude_pid = session.pid

        registered = [
            r for r in api.requests if '"superseded_session"' in r.text() or '"registered_at"' in r.text()
        ]
        assert f'"session":"claude-{claude_pid}-' in registered[0].last_user_text().replace(" ", "")
        assert '"envelopes":[]' in first.last_user_text().replace(" ", "")
        helper_env = helper_runs[0].read_text()
        assert "CLAUDE_CODE_MCP_SERVER_NAME=relay" in helper_env
        assert f"CLAUDE_CODE_MCP_SERVER_URL={serve.url}" in helper_env
        assert "CLAUDE_CODE_SESSION_ID" not in helper_env and "CLAUDE_PID" not in helper_env
        inputs = [json.loads(p.read_text()) for p in sorted(logs.glob(f"hook-{claude_pid}-*.stdin"))]
        events = {i["hook_event_name"]: i for i in inputs}  # the file name's $PPID is Claude Code's
        assert set(events) == {"SessionStart", "Stop"}
        assert events["SessionStart"]["source"] == "startup" and "stop_hook_active" in events["Stop"]
        assert len({i["session_id"] for i in inputs}) == 1 and all(i["cwd"] == str(folder) for i in inputs)
        for env in (p.read_text() for p in logs.glob(f"hook-{claude_pid}-*.env")):
            assert f"CLAUDE_PID={claude_pid}" in env and f"CLAUDE_PROJECT_DIR={folder}" in env
            assert f"CLAUDE_CODE_SESSION_ID={inputs[0]['session_id']}" in env
            assert "CLAUDE_CODE_MESSAGING_SOCKET=/" in env
