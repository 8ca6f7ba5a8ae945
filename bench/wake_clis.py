"""Wake latency per coding-agent CLI path, driven headlessly: send -> the CLI's wake command or the hook's
answer, through the real ``relay hook`` processes a set-up folder runs (``bench/wake.py`` reports them).

- ``cli_wake_claude_code_*``: ``relay hook wait`` (Claude Code's ``asyncRewake`` hook) parked on the
  mail-pending wait; send -> the hook exits 2 with the summary (what makes Claude Code start a turn).
- ``cli_wake_codex_*``: ``relay hook codex-wait`` (the waiter a Codex ``SessionStart`` hook starts); send
  -> it runs ``codex queue --thread ID --message SUMMARY`` (here a stand-in that records the time it ran:
  the real ``codex queue`` adds 0.1-0.2 s, docs/agents/codex.md).
- ``cli_wake_gemini_*``: ``relay hook after-turn`` (Gemini CLI's ``AfterAgent`` hook) parked; send -> it
  exits 2 with the summary (Gemini CLI's next prompt).
- ``cli_wake_copilot_*``: the same hook as the Copilot CLI's ``agentStop`` (``--answer decision``); send
  -> it exits 0 having printed ``{"decision": "block", "reason": SUMMARY}``.
- ``cli_wake_opencode_*``: ``relay hook wake-stream`` (what opencode's relay plugin runs); send -> its
  ``{"summary"}`` line is read (the plugin then calls ``promptAsync``).

Each path has its own agent and a credential issued by ``relay credentials issue`` (the hooks exchange
it at ``/agent/token`` as in a set-up folder); a sample is one send by another agent once the path's
wait is parked (the worker's ``csf_relay_long_polls_parked`` gauge). Times are wall-clock
(``time.time``) across processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from broker.front.key_file import load_key_file
from broker.front.paths import MCP_PATH
from broker.front.tokens import agent_headers, generate_key
from relay import credential_file
from relay.claude_code import relay_http

RELAY = [sys.executable, "-m", "relay"]
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {within} s")
        time.sleep(0.005)


class _Bench:
    def __init__(self, redis_url: str, tmp: Path, worker: Any) -> None:
        self.redis_url, self.tmp, self.worker = redis_url, tmp, worker
        self.url = worker.base + MCP_PATH
        self.keyring = load_key_file(tmp / "relay.key")
        self.run = secrets.token_hex(3)
        self.sender = agent_headers(self.keyring, f"cli-sender-{self.run}", "s-sender", 3600)
        relay_http.register(self.url, self.sender, "127.0.0.1:14111")

    def folder(self, name: str) -> tuple[str, Path]:
        """A folder with a fresh credential for agent ``cli-NAME-RUN``: the agent and its credential file."""
        agent = f"cli-{name}-{self.run}"
        issued = subprocess.run(
            [*RELAY, "credentials", "issue", "--agent", agent, "--redis-url", self.redis_url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        secret = issued.stdout.strip().splitlines()[-1]
        path = credential_file.path_in(self.tmp / name)
        credential_file.write(path, credential_file.CredentialFile(self.url, agent, secret))
        return agent, path

    def send(self, to: str) -> float:
        """A note from the sender to ``to``; the wall time just before the send."""
        at = time.time()
        relay_http.call_tool(
            self.url,
            self.sender,
            "SendAgentMessage",
            {"to": to, "message": {"kind": "note", "text": "wake up"}},
        )
        return at

    def parked_above(self, before: int) -> Callable[[], bool]:
        return lambda: self.worker.parked() > before


def _hook_exit(
    bench: _Bench, argv: list[str], stdin: str, env: dict[str, str], to: str, samples: int, code: int = 2
) -> list[float]:
    """Start the hook ``samples`` times; each time send once it is parked and time send -> exit 2."""
    found = []
    for _ in range(samples):
        before = bench.worker.parked()
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
            _until(bench.parked_above(before), 30, "the hook parked its wait")
            sent = bench.send(to)
            proc.wait(30)
            ended = time.time()
            if proc.returncode != code:
                raise RuntimeError(
                    f"{argv[3]} exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
                )
            found.append((ended - sent) * 1000)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return found


def _claude_code(bench: _Bench, samples: int) -> list[float]:
    agent, path = bench.folder("claude")
    claude = subprocess.Popen(["sleep", "3600"])  # the "Claude Code process" the hook serves
    try:
        argv = [*RELAY, "hook", "wait", "--credential-file", str(path), "--timeout", "60"]
        argv += ["--claude-pid", str(claude.pid)]
        hook_input = json.dumps({"hook_event_name": "SessionStart", "session_id": "bench"})
        return _hook_exit(bench, argv, hook_input, dict(os.environ), agent, samples)
    finally:
        claude.kill()
        claude.wait()


def _gemini(bench: _Bench, samples: int) -> list[float]:
    agent, path = bench.folder("gemini")
    session = f"gemini-bench-{bench.run}"
    exchanged = credential_file.exchange(credential_file.load(path), session)
    relay_http.register(bench.url, exchanged, "127.0.0.1:14111")
    argv = [*RELAY, "hook", "after-turn", "--credential-file", str(path), "--session-env", "RELAY_SESSION_ID"]
    argv += ["--timeout", "60"]
    return _hook_exit(bench, argv, "{}", {**os.environ, "RELAY_SESSION_ID": session}, agent, samples)


def _copilot(bench: _Bench, samples: int) -> list[float]:
    agent, path = bench.folder("copilot")
    session = f"copilot-bench-{bench.run}"
    exchanged = credential_file.exchange(credential_file.load(path), session)
    relay_http.register(bench.url, exchanged, "127.0.0.1:14111")
    argv = [*RELAY, "hook", "after-turn", "--credential-file", str(path), "--session-env", "RELAY_SESSION_ID"]
    argv += ["--timeout", "60", "--answer", "decision"]
    return _hook_exit(bench, argv, "{}", {**os.environ, "RELAY_SESSION_ID": session}, agent, samples, code=0)


def _opencode(bench: _Bench, samples: int) -> list[float]:
    agent, path = bench.folder("opencode")
    argv = [
        *RELAY,
        "hook",
        "wake-stream",
        "--credential-file",
        str(path),
        "--session",
        f"opencode-bench-{bench.run}",
    ]
    before = bench.worker.parked()
    waiter = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    found = []
    try:
        assert waiter.stdout is not None
        for _ in range(samples):
            _until(bench.parked_above(before), 30, "the opencode waiter parked its wait")
            sent = bench.send(agent)
            line = waiter.stdout.readline()
            if '"summary"' not in line:
                raise RuntimeError(f"wake-stream printed {line!r}")
            found.append((time.time() - sent) * 1000)
    finally:
        waiter.terminate()
        waiter.wait(30)
    return found


def _codex(bench: _Bench, samples: int) -> list[float]:
    agent, path = bench.folder("codex")
    ran = bench.tmp / "codex-queue.times"
    stand_in = bench.tmp / "codex-queue"
    stand_in.write_text(f'#!/bin/sh\ndate +%s.%N >> "{ran}"\n')
    stand_in.chmod(0o755)
    argv = [
        *RELAY,
        "hook",
        "codex-wait",
        "--credential-file",
        str(path),
        "--session",
        f"codex-bench-{bench.run}",
    ]
    argv += ["--thread", "01a23a96-14ae-7193-b883-dce3c4cc4345", "--codex", str(stand_in)]
    before = bench.worker.parked()
    waiter = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    found = []
    try:
        for i in range(samples):
            _until(bench.parked_above(before), 30, "the codex waiter parked its wait")
            sent = bench.send(agent)
            _until(lambda n=i: ran.exists() and len(ran.read_text().split()) > n, 30, "codex queue ran")
            found.append((float(ran.read_text().split()[i]) - sent) * 1000)
    finally:
        waiter.terminate()
        waiter.wait(30)
    return found


@contextlib.contextmanager
def _worker(redis_url: str, tmp: Path) -> Iterator[Any]:
    try:
        from bench.wake import Worker, socket_port
    except ImportError:  # run as a script from bench/
        from wake import Worker, socket_port  # type: ignore[no-redef]

    key_file = tmp / "relay.key"
    key_file.write_text(generate_key() + "\n")
    key_file.chmod(0o600)
    with socket_port() as port:
        worker = Worker(redis_url, key_file, port, 200)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


def cli_wake_figures(redis_url: str, *, samples: int = 20) -> dict[str, Any]:
    """p50/p99 (ms) of each CLI path's send -> wake, ``samples`` sends each."""
    tmp = Path(tempfile.mkdtemp(prefix="relay-wake-clis-"))
    figures: dict[str, Any] = {"cli_wake_samples": samples}
    with _worker(redis_url, tmp) as worker:
        bench = _Bench(redis_url, tmp, worker)
        paths = [("claude_code", _claude_code), ("codex", _codex), ("gemini", _gemini)]
        paths += [("copilot", _copilot), ("opencode", _opencode)]
        for name, path in paths:
            values = path(bench, samples)
            figures[f"cli_wake_{name}_p50_ms"] = _percentile(values, 0.5)
            figures[f"cli_wake_{name}_p99_ms"] = _percentile(values, 0.99)
    return figures
