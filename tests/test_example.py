"""The example host application runs, converses and ends by itself, on both backends."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import first_command, relay_env

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
