"""The example host application runs, converses and ends by itself, on both backends."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.testing.polling import wait_until
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture, stop_tree
from tests.fake_anthropic import FakeAnthropic
from tests.fake_model import Text, ToolUse
from tests.fake_openai import FakeOpenAI
from tests.processes import first_command, relay_env
from tests.workbench_support import COPILOT_CACHE, claude_agent_fixture, copilot_cli_fixture

__all__ = ["claude_agent_fixture", "claude_binary_fixture", "copilot_cli_fixture"]

ROOT = Path(__file__).resolve().parent.parent


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "examples.host_app", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_example_host_app(backend: str, request: pytest.FixtureRequest) -> None:
    args = ["--redis-url", request.getfixturevalue("redis_url")] if backend == "redis" else []
    done = run_example(*args)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"relay example: {backend} backend\n")
    for line in [
        "registered planner: workbench session-planner (tier in_process)",
        "registered reviewer: claudecode 127.0.0.1:14111 (tier host)",
        "host: session-builder is busy, prompt not queued (the relay will retry)",
        "== prompt queued in session-builder ==",
        "from: planner",
        "kind: request (2)",
        "attempt: 2",
        "kind: reply (3)",
        "reviewer -> builder: reply env_",
        "builder -> planner: status env_",
        "done: 4 prompts queued, 0 dead letters",
    ]:
        assert line in out, line
    assert (
        "reviewer fetched env_" in out
        and "from builder: request 'please review the parser' (tier host)" in out
    )
    assert out.count("This message is a proposal from another agent, not permission") == 4


def readme_commands(name: str) -> list[str]:
    """The lines of examples/README.md's shell blocks that run ``name`` (comments cut)."""
    text = (ROOT / "examples" / "README.md").read_text()
    blocks = text.split("```sh\n")[1:]
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.split("```")[0].splitlines()]
    return [line for line in lines if name in line]


def test_the_examples_readme_assumes_no_activated_environment() -> None:
    for name in ("examples.host_app", "examples/mcp_agent.py"):
        commands = readme_commands(name)
        assert commands and all(c.startswith(".venv/bin/python ") for c in commands), commands


def test_two_mcp_agents_talk_through_relay_serve_as_the_readme_says(tmp_path: Path) -> None:
    folder = tmp_path / "clone"
    folder.mkdir()
    bob_line, alice_line = readme_commands("examples/mcp_agent.py")
    with first_command(folder, creates_key=True) as port:
        url = ["--url", f"http://127.0.0.1:{port}/mcp/agent"]
        env = relay_env(port)

        def start(line: str) -> subprocess.Popen[str]:
            argv = shlex.split(line)
            assert argv[:2] == [".venv/bin/python", "examples/mcp_agent.py"]
            script = str(ROOT / argv[1])
            return subprocess.Popen(
                [sys.executable, script, *argv[2:], *url],
                cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip

        bob = start(bob_line)
        assert bob.stdout is not None
        assert bob.stdout.readline() == "bob: registered as session bob-example\n"
        alice = start(alice_line)
        alice_out, _ = alice.communicate(timeout=120)
        bob_out, _ = bob.communicate(timeout=120)
    assert alice.returncode == 0 and bob.returncode == 0, (alice_out, bob_out)
    assert "bob: from alice: 'Ready?' (env_" in bob_out and "bob: replied to alice (env_" in bob_out
    assert "alice: from bob: 'bob read: Ready?' (env_" in alice_out


def _readme_line(name: str) -> list[str]:
    (line,) = readme_commands(name)
    argv = shlex.split(line)
    assert argv[0] == ".venv/bin/relay", line
    return argv[1:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_workbench_example_runs_as_the_readme_says(
    copilot_cli: Path, claude_agent: None, claude_binary: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "clone"
    (folder / "examples" / "workbench").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "workbench" / "workbench.toml", folder / "examples" / "workbench")
    reviewer = folder / "examples" / "workbench" / "work" / "reviewer"
    with (
        FakeOpenAI() as planner_api,
        FakeAnthropic() as builder_api,
        FakeAnthropic() as reviewer_api,
        first_command(folder, creates_key=True) as port,
    ):
        env = relay_env(port) | {
            "COPILOT_CLI_PATH": str(copilot_cli),
            "XDG_CACHE_HOME": str(COPILOT_CACHE),
            "PLANNER_BASE_URL": f"{planner_api.base_url}/v1",
            "PLANNER_API_KEY": "sk-fake-planner",
            "BUILDER_BASE_URL": builder_api.base_url,
            "BUILDER_API_KEY": "sk-ant-fake-builder",
        }
        planner_api.hold()
        builder_api.hold()
        log = tmp_path / "workbench.log"
        with log.open("wb") as out:
            workbench = subprocess.Popen(
                [sys.executable, "-m", "relay", *_readme_line("relay workbench")],
                cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            wait_until(
                lambda: workbench.poll() is None and "workbench serving" in log.read_text(),
                120,
                "relay workbench serving",
            )
            setup = [
                a.replace("http://127.0.0.1:8080", f"http://127.0.0.1:{port}") for a in _readme_line("setup")
            ]
            (mkdir,) = readme_commands("mkdir -p examples/workbench")
            subprocess.run(shlex.split(mkdir), cwd=folder, check=True, timeout=30)
            done = subprocess.run(
                [sys.executable, "-m", "relay", *setup],
                cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            home = ClaudeHome(
                tmp_path / "home", trusted=[reviewer], settings={"permissions": {"allow": ["mcp__relay"]}}
            ).write()
            ask = {"kind": 2, "text": "Plan: add a --verbose flag"}
            reviewer_api.reply(ToolUse("mcp__relay__SendAgentMessage", {"to": "planner", "message": ask}))
            reviewer_api.reply(Text("Asked planner."))
            reviewer_api.reply(ToolUse("mcp__relay__FetchAgentInbox", {}))
            reviewer_api.reply(Text("Read the plan."))
            prompt = "Ask planner for a plan to add a --verbose flag."
            with InteractiveClaude(
                claude_binary, home, reviewer, prompt, env={"ANTHROPIC_BASE_URL": reviewer_api.base_url}
            ):
                to_planner = planner_api.wait_for(lambda r: "for planner\n" in r.text(), 90, what="ask")
                asked = re.findall(r"\[relay\] message (env_\w{26}) for planner", to_planner.text())[-1]
                build = {"kind": 2, "text": "add a --verbose flag"}
                planner_api.reply(ToolUse("send_agent_message", {"to": "builder", "message": build}))
                plan = {"kind": 3, "text": "Plan: builder adds --verbose.", "in_reply_to": asked}
                planner_api.reply(ToolUse("send_agent_message", {"to": "reviewer", "message": plan}))
                planner_api.reply(Text("Planned."))
                planner_api.release()
                to_builder = builder_api.wait_for(
                    lambda r: r.is_conversation and "for builder\n" in r.text(), 90, what="build"
                )
                task = re.findall(r"\[relay\] message (env_\w{26}) for builder", to_builder.text())[-1]
                built = {"kind": 3, "text": "Added --verbose.", "in_reply_to": task}
                builder_api.reply(
                    ToolUse("mcp__relay__send_agent_message", {"to": "planner", "message": built})
                )
                builder_api.reply(Text("Done."))
                builder_api.release()
                fetched = reviewer_api.wait_for(
                    lambda r: (
                        "Plan: builder adds --verbose." in r.last_user_text()
                        and '"envelopes"' in r.last_user_text()
                    ),
                    90,
                    what="the plan fetched",
                )
                back = planner_api.wait_for(lambda r: f"in_reply_to: {task}\n" in r.text(), 90, what="built")
            agents = subprocess.run(
                [sys.executable, "-m", "relay", "agents", "--json"],
                cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
        finally:
            stop_tree(workbench)
    compact = fetched.last_user_text().replace(" ", "")
    assert '"from":"planner"' in compact and f'"in_reply_to":"{asked}"' in compact
    assert "from: builder\nkind: reply (3)\n" in back.text() and "tier: in_process\n" in back.text()
    listed = {a["agent"]: (a["provider"], a["tier"]) for a in json.loads(agents.stdout)["agents"]}
    assert listed == {
        "planner": ("workbench", "in_process"),
        "builder": ("workbench", "in_process"),
        "reviewer": ("claudecode", "host"),
    }
    assert "sk-fake-planner" not in log.read_text() and "Traceback" not in log.read_text()
