"""Claude Code, the real client, driven offline: the installed binary, a throw-away home, and an
interactive session under a pseudo-terminal.

Nothing is installed at import. ``scripts/install-claude-code`` puts the pinned npm package into
``.tools/claude-code`` (CI runs it from ``.ci/run``); the ``claude_binary`` fixture finds the platform
binary there and skips, naming the reason, where node/npm or the binary is missing.

``ClaudeHome`` is a private ``HOME``/``CLAUDE_CONFIG_DIR``: onboarding done, the given project folders
trusted, the model at a loopback ``ANTHROPIC_BASE_URL`` with a key from ``apiKeyHelper``, and no
nonessential traffic. ``run_claude`` runs one non-interactive command (``claude mcp list``);
``InteractiveClaude`` runs the TUI under a pseudo-terminal. Every wait is bounded, and every process
the session started (hooks, helpers) is stopped by PID on the way out.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = "2.1.332"
"""The Claude Code release these tests pin (also in ``scripts/install-claude-code``)."""
INSTALL_DIR = ROOT / ".tools" / "claude-code"
INSTALL_SCRIPT = ROOT / "scripts" / "install-claude-code"
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def binary_path() -> Path:
    """Where ``scripts/install-claude-code`` puts the platform binary on this machine, or else the same
    build the Claude Agent SDK's wheel bundles (``relay[claude-agent]``: the script then installs
    nothing)."""
    arch = _ARCH.get(platform.machine().lower(), platform.machine().lower())
    package = f"claude-code-{platform.system().lower()}-{arch}"
    npm = INSTALL_DIR / "node_modules" / "@anthropic-ai" / package / "claude"
    sdk = importlib.util.find_spec("claude_agent_sdk")
    if npm.exists() or sdk is None or sdk.origin is None:
        return npm
    return Path(sdk.origin).parent / "_bundled" / "claude"


@pytest.fixture(scope="session", name="claude_binary")
def claude_binary_fixture() -> Path:
    """The installed Claude Code binary of the pinned version; skips (with the reason) otherwise."""
    binary = binary_path()
    if not binary.exists():
        if shutil.which("node") is None or shutil.which("npm") is None:
            pytest.skip("Claude Code tests need node and npm (then run scripts/install-claude-code)")
        pytest.skip(f"Claude Code is not installed at {binary}; run scripts/install-claude-code")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    if not version.stdout.startswith(VERSION):
        pytest.skip(f"{binary} is {version.stdout.strip()!r}, not {VERSION}; run scripts/install-claude-code")
    return binary


def strip_ansi(text: str) -> str:
    """Terminal output without escape sequences (cursor moves become nothing, so words may run on)."""
    return _ANSI.sub("", text)


# --- the throw-away home ---------------------------------------------------------------------------


@dataclass
class ClaudeHome:
    """A private Claude Code configuration: ``root`` is both ``HOME`` and ``CLAUDE_CONFIG_DIR``."""

    root: Path
    api_url: str = "http://127.0.0.1:9"
    """The (fake) Messages API; a closed port by default, for commands that need no model."""
    trusted: list[Path] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    """Extra user settings (``$CLAUDE_CONFIG_DIR/settings.json``)."""
    path: Sequence[Path] = ()
    """Folders put in front of ``PATH`` (where the hooks' and helpers' commands are found)."""

    def write(self) -> Self:
        """(Re)write ``.claude.json`` and ``settings.json``."""
        self.root.mkdir(parents=True, exist_ok=True)
        projects = {
            str(p.resolve()): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
            for p in self.trusted
        }
        state = {"hasCompletedOnboarding": True, "projects": projects}
        (self.root / ".claude.json").write_text(json.dumps(state, indent=2))
        settings = {"apiKeyHelper": "echo sk-ant-offline-test", **self.settings}
        (self.root / "settings.json").write_text(json.dumps(settings, indent=2))
        return self

    def trust(self, folder: Path) -> None:
        self.trusted.append(folder)
        self.write()

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment (none of this process's variables but ``PATH`` and the locale)."""
        path = os.pathsep.join([*map(str, self.path), os.environ.get("PATH", "/usr/bin:/bin")])
        env = {
            "PATH": path,
            "HOME": str(self.root),
            "CLAUDE_CONFIG_DIR": str(self.root),
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "ANTHROPIC_BASE_URL": self.api_url,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "TMPDIR": str(self.root / "tmp"),
        }
        (self.root / "tmp").mkdir(exist_ok=True)
        return {**env, **(extra or {})}


def run_claude(
    binary: Path,
    home: ClaudeHome,
    cwd: Path,
    *args: str,
    timeout: float = 90.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """One non-interactive ``claude ARGS`` in ``cwd``; stdin is closed, output captured as text."""
    proc = subprocess.Popen(
        [str(binary), *args],
        cwd=cwd,
        env=home.environment(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"claude {' '.join(args)} did not finish in {timeout} s: {out}{err}") from None
    finally:
        stop_tree(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# --- processes ---------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first, then theirs)."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_tree(process: int | subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM ``process`` and everything it started (collected by PID first), SIGKILL what is left.
    Given a ``Popen``, it also learns the exit (warnings are errors: an unwaited ``Popen`` warns)."""
    pid = process if isinstance(process, int) else process.pid
    pids = [pid, *descendants(pid)]
    for each in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for each in pids:
        while _alive(each) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(each):
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
    if not isinstance(process, int):
        process.wait(timeout)  # already reaped by _alive: Popen takes that as an exit
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


# --- the interactive session -------------------------------------------------------------------------


class InteractiveClaude:
    """``claude ARGS`` in ``cwd`` under a pseudo-terminal of ``rows`` x ``cols``.

    A reader thread keeps the terminal drained; ``output`` is everything it printed so far,
    ``screen_text`` the same without escape sequences. Use as a context manager: the session and
    every process it started are stopped on the way out.
    """

    def __init__(
        self,
        binary: Path,
        home: ClaudeHome,
        cwd: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        rows: int = 50,
        cols: int = 160,
    ) -> None:
        self.argv = [str(binary), *args]
        self.cwd = cwd
        self.env = home.environment(env)
        self.size = (rows, cols)
        self._output = bytearray()
        self._changed = threading.Condition()
        self._master = -1
        self._closing = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Self:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *self.size, 0, 0))
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        os.set_blocking(master, False)  # a session that stops reading must not block the test
        self._master = master
        self._reader = threading.Thread(target=self._drain, name="claude-pty", daemon=True)
        self._reader.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def stop(self) -> None:
        """Stop the session and every process below it (by PID); close the terminal."""
        if self.proc is not None:
            stop_tree(self.proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self._closing.set()
        if self._reader is not None:
            self._reader.join(5)
        if self._master >= 0:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = -1

    def _drain(self) -> None:
        while True:
            ready, _, _ = select.select([self._master], [], [], 0.5)
            try:
                chunk = os.read(self._master, 65536) if ready else None
            except BlockingIOError:
                chunk = None
            except OSError:  # EIO: the session closed the terminal
                chunk = b""
            if chunk is None:
                if self._closing.is_set():
                    return
                continue
            with self._changed:
                if not chunk:
                    self._changed.notify_all()
                    return
                self._output += chunk
                self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return self._output.decode("utf-8", "replace")

    def screen_text(self) -> str:
        return strip_ansi(self.output)

    def mark(self) -> int:
        """Where the output is now: ``wait_for_text(..., since=mark)`` looks only at what comes after."""
        with self._changed:
            return len(self._output)

    def wait_quiet(self, quiet: float, timeout: float) -> None:
        """Wait until the terminal printed nothing for ``quiet`` seconds (a dialog that finished drawing),
        at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                size, since = len(self._output), time.monotonic()
                while len(self._output) == size and time.monotonic() - since < quiet:
                    self._changed.wait(quiet)
                if len(self._output) == size:
                    return
                if time.monotonic() >= deadline:
                    raise AssertionError(f"the session kept drawing for {timeout} s: {self.tail()}")

    def wait_for_text(self, needle: str, timeout: float, since: int = 0) -> None:
        """Wait (at most ``timeout`` seconds) until the terminal has shown ``needle`` after byte ``since``
        (spaces ignored: the TUI moves the cursor instead of printing them)."""
        want = "".join(needle.split())
        deadline = time.monotonic() + timeout
        with self._changed:
            while want not in "".join(strip_ansi(self._output[since:].decode("utf-8", "replace")).split()):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc is not None and self.proc.poll() is not None):
                    tail = strip_ansi(self._output.decode("utf-8", "replace"))[-1500:]
                    raise AssertionError(f"the session did not show {needle!r} in {timeout} s: {tail}")
                self._changed.wait(min(left, 0.5))

    def type(self, text: str, timeout: float = 10.0) -> None:
        """Type ``text`` into the terminal (``\\r`` is Enter); fails rather than blocks when the session
        has ended or does not read its input."""
        data = text.encode()
        deadline = time.monotonic() + timeout
        while data:
            if not self.alive():
                raise AssertionError(f"the session ended before {text!r} was typed: {self.tail()}")
            try:
                data = data[os.write(self._master, data) :]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise AssertionError(f"the session did not read {text!r} in {timeout} s") from None
                select.select([], [self._master], [], 0.1)

    def tail(self, chars: int = 1500) -> str:
        """The end of what the terminal showed, escape sequences removed."""
        return self.screen_text()[-chars:]

    def type_until(self, text: str, needle: str, timeout: float, every: float = 2.0) -> None:
        """Type ``text`` until the terminal shows ``needle`` after it, again every ``every`` seconds (the
        TUI may drop a key that comes right after it redrew); only for keys that are harmless to repeat
        (Enter on a dialog). At most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        since = self.mark()
        while True:
            self.type(text)
            try:
                self.wait_for_text(needle, min(every, max(deadline - time.monotonic(), 0.1)), since=since)
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
