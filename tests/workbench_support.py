"""The Workbench runtimes for real, offline: the pinned SDKs (``relay[copilot]``, ``relay[claude-agent]``)
and the Copilot CLI that ``scripts/install-agent-sdks`` puts in ``.tools/copilot`` (CI runs it), at
fake model APIs on loopback.

``copilot_cli`` / ``claude_agent`` are fixtures that skip, naming the reason, where a package is
missing. ``write_config`` writes a ``workbench.toml``; ``hosting`` runs ``relay.workbench.host`` in the
test's event loop (``WorkbenchProcess`` runs ``relay workbench`` as a child process, for kill tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.workbench.runtime import WorkbenchSessions
from broker.testing.polling import eventually
from relay.workbench import host
from relay.workbench_config import load
from tests.claude_code import stop_tree
from tests.fake_model import FakeModelAPI, Recorded

ROOT = Path(__file__).resolve().parents[1]
COPILOT_VERSION = "1.0.102"
"""The Copilot CLI release these tests pin (also in ``scripts/install-agent-sdks``)."""
COPILOT_DIR = ROOT / ".tools" / "copilot"
COPILOT_CLI = COPILOT_DIR / "node_modules" / "@github" / "copilot-linux-x64" / "copilot"
COPILOT_CACHE = COPILOT_DIR / "cache"
"""``XDG_CACHE_HOME`` of the tests' Copilot CLIs: the CLI unpacks 235 MB there once, not per test."""
REQUEST_BOUND = 90.0
INSTALL = "run scripts/install-agent-sdks (CI runs it)"


@pytest.fixture(scope="session", name="copilot_cli")
def copilot_cli_fixture() -> Path:
    """The pinned Copilot CLI, with the SDK installed; skips with the reason otherwise."""
    if importlib.util.find_spec("copilot") is None:
        pytest.skip(f"the GitHub Copilot SDK is not installed (pip install 'relay[copilot]'); {INSTALL}")
    if not COPILOT_CLI.exists():
        pytest.skip(f"the Copilot CLI {COPILOT_VERSION} is not installed at {COPILOT_CLI}; {INSTALL}")
    return COPILOT_CLI


@pytest.fixture(scope="session", name="claude_agent")
def claude_agent_fixture() -> None:
    """Skips, with the reason, where the Claude Agent SDK (and its bundled claude) is missing."""
    if importlib.util.find_spec("claude_agent_sdk") is None:
        pytest.skip(f"the Claude Agent SDK is not installed (pip install 'relay[claude-agent]'); {INSTALL}")


@pytest.fixture(name="cli_environment")
def cli_environment_fixture(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What the session CLIs started in this test inherit: the shared Copilot cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(COPILOT_CACHE))
    return {"XDG_CACHE_HOME": str(COPILOT_CACHE)}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def write_config(path: Path, agents: Sequence[Mapping[str, Any]], **delivery: Any) -> Path:
    """A ``workbench.toml`` with ``agents`` (``provider`` a nested table) and ``[delivery]``."""
    lines = []
    if delivery:
        lines += ["[delivery]", *(f"{k} = {_toml(v)}" for k, v in delivery.items()), ""]
    for agent in agents:
        lines.append("[[agent]]")
        lines += [f"{k} = {_toml(v)}" for k, v in agent.items() if k != "provider"]
        if "provider" in agent:
            lines.append("[agent.provider]")
            lines += [f"{k} = {_toml(v)}" for k, v in agent["provider"].items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def copilot_agent_entry(agent: str, api_url: str, cli: Path, **more: Any) -> dict[str, Any]:
    """A Copilot agent at a fake chat-completions API (key in ``FAKE_OPENAI_KEY``)."""
    provider = {"type": "openai", "base_url": f"{api_url}/v1", "api_key_env": "FAKE_OPENAI_KEY"}
    return {"id": agent, "runtime": "copilot", "model": "gpt-4.1", "dir": f"work/{agent}",
            "cli_path": str(cli), "provider": provider, **more}  # fmt: skip


def claude_agent_entry(agent: str, api_url: str, **more: Any) -> dict[str, Any]:
    """A Claude Agent SDK agent at a fake Messages API (key in ``FAKE_ANTHROPIC_KEY``)."""
    provider = {"type": "anthropic", "base_url": api_url, "api_key_env": "FAKE_ANTHROPIC_KEY"}
    return {"id": agent, "runtime": "claude-agent", "model": "claude-sonnet-4-5", "dir": f"work/{agent}",
            "provider": provider, **more}  # fmt: skip


KEYS = {"FAKE_OPENAI_KEY": "sk-fake-openai", "FAKE_ANTHROPIC_KEY": "sk-ant-fake"}


@dataclass
class Hosted:
    sessions: WorkbenchSessions
    task: asyncio.Task[int]

    def pid(self, agent: str) -> int:
        live = self.sessions.live(f"workbench.{agent}")
        assert live is not None and live.pid is not None, f"{agent} has no live session"
        return live.pid


@contextlib.asynccontextmanager
async def hosting(config: Path, url: str, prefix: str, data_dir: Path, agents: int) -> AsyncIterator[Hosted]:
    """``relay.workbench.host`` for ``config`` in this event loop, until the block ends; yields once
    its ``agents`` sessions are open and registered."""
    loaded = load(config, {**os.environ, **KEYS})
    assert len(loaded.config.agent) == agents
    stop, ready = asyncio.Event(), asyncio.Event()
    sessions = WorkbenchSessions()
    task = asyncio.create_task(
        host(loaded, url, data_dir, stop=stop, prefix=prefix, sessions=sessions, ready=ready)
    )
    try:
        await eventually(lambda: task.done() or ready.is_set(), 120, "the Workbench agents registered")
        if task.done():
            task.result()
        yield Hosted(sessions, task)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)


class WorkbenchProcess:
    """``relay workbench --config FILE --redis-url URL`` as a child process (its own session, so a
    SIGKILL reaches only it), logging to ``log``."""

    def __init__(self, config: Path, redis_url: str, data_dir: Path, log: Path) -> None:
        self.argv = [sys.executable, "-m", "relay", "workbench", "--config", str(config),
                     "--redis-url", redis_url, "--data-dir", str(data_dir)]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkbenchProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env |= {"PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(COPILOT_CACHE), **KEYS}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


async def request_where(api: FakeModelAPI, predicate: Callable[[Recorded], bool], what: str) -> Recorded:
    """``api.wait_for`` off the event loop (the sessions' host runs on it), bounded."""
    return await asyncio.to_thread(api.wait_for, predicate, REQUEST_BOUND, what=what)
