"""The coding-agent CLIs of the host tier (Codex, Gemini CLI), driven offline by the tests: where
``scripts/install-clis`` put them, a clean environment for a throw-away ``HOME``, and one command run to
completion. Nothing is installed at import; a fixture skips, naming the reason, when a CLI is missing.

The pinned versions are those of ``scripts/npm-clis.txt`` (read here, one definition).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.claude_code import stop_tree

ROOT = Path(__file__).resolve().parents[1]
INSTALL_DIR = ROOT / ".tools" / "clis"
PINS = ROOT / "scripts" / "npm-clis.txt"
AGENT_TOOLS = (
    "RegisterAgentAddress",
    "SendAgentMessage",
    "FetchAgentInbox",
    "AcknowledgeAgentInbox",
    "GetMessageStatus",
    "ListAgents",
    "SearchAgentMessages",
)
"""The tools ``relay serve`` offers an agent (``broker.front.tools.relay_tools``, history on)."""
WAKE_BOUND_S = 30.0
"""How long a test waits for a CLI to be woken by mail (or to announce it at the end of a turn): a bound,
not the latency (bench/wake.py measures that: tens of ms p99 on a quiet machine, the 3 s the docs promise
with room to spare). On a loaded machine a CLI takes seconds to start its turn; without a wake nothing
arrives at all, so the bound only decides how long a failure takes to show."""


def pinned(package: str) -> str:
    """The version ``scripts/npm-clis.txt`` pins for ``package``."""
    for line in PINS.read_text().splitlines():
        name, _, version = line.strip().rpartition("@")
        if name == package:
            return version
    raise LookupError(f"{package} is not pinned in {PINS}")


def cli_binary(package: str, command: str) -> Path:
    """The installed ``command`` of the pinned ``package``; skips (with the reason) otherwise."""
    binary = INSTALL_DIR / "node_modules" / ".bin" / command
    manifest = INSTALL_DIR / "node_modules" / package / "package.json"
    if not binary.exists() or not manifest.exists():
        if shutil.which("node") is None or shutil.which("npm") is None:
            pytest.skip(f"{command} tests need node and npm (then run scripts/install-clis)")
        pytest.skip(f"{package} is not installed in {INSTALL_DIR}; run scripts/install-clis")
    version = json.loads(manifest.read_text())["version"]
    if version != pinned(package):
        pytest.skip(f"{package} {version} is installed, not {pinned(package)}; run scripts/install-clis")
    return binary


def clean_environment(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """None of this process's variables but ``PATH`` (the CLIs' folder first) and the locale."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(
        [str(INSTALL_DIR / "node_modules" / ".bin"), os.environ.get("PATH", "/usr/bin:/bin")]
    )
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": str(home / "tmp")}
    return {**env, **(extra or {})}


def run_cli(
    argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float = 120.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """One CLI command to completion (bounded); it and everything it started are stopped by PID after."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        out, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"{' '.join(argv[:3])} did not finish in {timeout} s: {out[-2000:]}{err[-2000:]}"
        ) from None
    finally:
        stop_tree(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def secrets_in(folder: Path, secrets: list[str]) -> list[str]:
    """The files under ``folder`` (but its credential file) that hold any of ``secrets``."""
    found = []
    for path in folder.rglob("*"):
        if (
            path.is_file()
            and path.relative_to(folder).as_posix() != ".relay/credential"
            and ".git/" not in path.as_posix()
        ):
            text = path.read_text(errors="replace")
            found += [f"{path}: {s[:12]}…" for s in secrets if s and s in text]
    return found
