"""``relay hook wait``: the ``asyncRewake`` hook that wakes an idle Claude Code session when mail arrives.

Claude Code runs it at ``SessionStart`` and at every ``Stop`` (the end of each turn), in the background.
It blocks on relay's mail-pending wait; when the agent has envelopes it was not yet told about, it
prints a summary on stderr and exits 2, which makes Claude Code start a turn with that text.

Claude Code stops a hook at the hook's ``timeout`` (SIGTERM; the session is not woken), and only the
end of a turn arms a new one. So when the waiter's own ``timeout_s`` (just below the hook's) passes with
no mail, it wakes the session once with a short notice that there is nothing to do (``summary.rearm``):
the turn that follows ends with its ``Stop`` hook, which waits again. An idle session thus stays
reachable for as long as it runs, at the cost of one short turn per ``timeout_s`` of idleness.

Otherwise it exits 0 and says nothing the model sees:

- when relay refuses it for good (401, a superseded session, a bad request): a newer session took over;
- when the Claude Code process it serves is gone (first telling relay the session ended, so
  ``ListAgents`` and ``relay agents`` say ``gone``), or a newer waiter for the same session replaced it
  (one waiter per session: a lock in a private runtime folder; the newer one sends the older SIGTERM).

A relay that is down, slow or answering 5xx is retried quietly with bounded exponential backoff until
the timeout (then the re-arming wake); it never wakes the session with an error. At ``SessionStart``
the waiter first registers the session (``RegisterAgentAddress``), so a new Claude Code session
supersedes the previous one and keeps the inbox before its model calls anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from relay.claude_code import relay_http
from relay.claude_code.session import ClaudeProcess, NoSuchProcess
from relay.claude_code.summary import rearm, summary

EXIT_QUIET: Final = 0
EXIT_WAKE: Final = 2
WAIT_CHUNK_S: Final = 60.0
"""Longest single wait request; between two, the waiter notices a replaced or finished session."""
BACKOFF_FIRST_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
MAX_HOOK_INPUT: Final = 1024 * 1024
REPLACE_WITHIN_S: Final = 5.0
LEAVE_TIMEOUT_S: Final = 2.0
"""How long the waiter of a Claude Code process that exited tries to tell relay (``relay_http.leave``)."""
_UNIX_PATH_MAX: Final = 107
_WAITER_COMMANDS: Final = (b"wait", b"codex-wait", b"wake-stream")
"""The ``relay hook`` commands that hold a session's slot (``relay.codex.waiter`` shares it)."""


@dataclass(frozen=True, slots=True)
class WaitOptions:
    agent: str
    mcp_url: str
    wait_url: str
    claude_pid: int
    timeout_s: float
    headers: Callable[[str], Mapping[str, str]]
    """Fresh agent headers for a relay session id (a short-lived token each time)."""


class _Replaced(BaseException):
    """A newer waiter for the same session asked this one to go (SIGTERM)."""


def read_hook_input(stream: IO[str]) -> dict[str, Any]:
    """The hook's JSON on stdin (``session_id``, ``hook_event_name``, ...); ``{}`` when it is not JSON."""
    try:
        data = json.loads(stream.read(MAX_HOOK_INPUT))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run(options: WaitOptions, hook_input: Mapping[str, Any], stderr: IO[str], stdout: IO[str]) -> int:
    """Wait for mail as described above; return the exit code (0 quiet, 2 wake)."""
    try:
        claude = ClaudeProcess.of(options.claude_pid)
    except NoSuchProcess as exc:
        return _quiet(stdout, str(exc))
    session = claude.session_id
    try:
        slot = _Slot(runtime_dir(), f"{options.agent}.{session}")
    except OSError as exc:
        return _quiet(stdout, f"no private runtime folder: {exc}")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if not slot.take():
            return _quiet(stdout, "another waiter for this session would not give way")
        _watch(claude, lambda: leave(options.wait_url, options.headers, session))
        return _wait_loop(
            options, claude, hook_input.get("hook_event_name") == "SessionStart", stderr, stdout
        )
    except _Replaced:
        return _quiet(stdout, "replaced by a newer waiter")
    finally:
        signal.signal(signal.SIGTERM, previous)
        slot.release()


def _wait_loop(
    options: WaitOptions, claude: ClaudeProcess, register: bool, stderr: IO[str], stdout: IO[str]
) -> int:
    session = claude.session_id
    deadline = time.monotonic() + options.timeout_s
    delay = BACKOFF_FIRST_S
    while (left := deadline - time.monotonic()) > 0:
        try:
            if register:
                relay_http.register(options.mcp_url, options.headers(session), _endpoint(session))
                register = False
            pending = relay_http.wait(
                options.wait_url, options.headers(session), int(min(left, WAIT_CHUNK_S) * 1000)
            )
        except relay_http.Refused as exc:
            return _quiet(stdout, str(exc))
        except relay_http.Unavailable:
            time.sleep(min(delay * random.uniform(0.5, 1.0), max(left, 0)))
            delay = min(delay * 2, BACKOFF_MAX_S)
            continue
        except Exception as exc:  # a key file gone bad, ...: never an error in front of the model
            return _quiet(stdout, f"{type(exc).__name__}: {exc}")
        delay = BACKOFF_FIRST_S
        if pending.count > 0:
            print(summary(options.agent, pending.answer), file=stderr, flush=True)
            return EXIT_WAKE
    print(rearm(options.agent, options.timeout_s), file=stderr, flush=True)
    return EXIT_WAKE


def leave(wait_url: str, headers: Callable[[str], Mapping[str, str]], session: str) -> None:
    """Tell the relay at ``wait_url`` that ``session`` ended (its presence reads ``gone`` at once);
    best effort, at most ``LEAVE_TIMEOUT_S``: without it the session reads ``gone`` once the presence
    window passes."""
    url = wait_url.removesuffix(relay_http.WAIT_PATH) + relay_http.LEAVE_PATH
    with contextlib.suppress(Exception):
        relay_http.leave(url, headers(session), LEAVE_TIMEOUT_S)


def _quiet(stdout: IO[str], why: str) -> int:
    """Exit 0; the reason goes to stdout, which Claude Code keeps in its debug log, not the model's view."""
    with contextlib.suppress(OSError, ValueError):
        print(f"relay hook wait: {why}", file=stdout, flush=True)
    return EXIT_QUIET


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Replaced


def _watch(claude: ClaudeProcess, ended: Callable[[], None]) -> None:
    """Leave (exit 0) within a second of the Claude Code process ending: Claude Code leaves background
    hooks running when it exits. ``ended`` runs first (it tells relay the session ended)."""

    def watch() -> None:
        while claude.alive():
            time.sleep(1.0)
        try:
            ended()
        finally:
            os._exit(EXIT_QUIET)

    threading.Thread(target=watch, name="claude-watch", daemon=True).start()


def _endpoint(session: str) -> str:
    """Where this session can be reached, for its registration: Claude Code's cross-session messaging
    socket when it exports one that fits an address, else ``session_endpoint``."""
    path = os.environ.get("CLAUDE_CODE_MESSAGING_SOCKET", "")
    if path.startswith("/") and len(path.encode()) <= _UNIX_PATH_MAX:
        return f"unix:{path}"
    return session_endpoint(session)


def session_endpoint(session: str) -> str:
    """A unix endpoint naming ``session`` in relay's runtime folder, within the address rule's 107 bytes:
    under a long ``$TMPDIR`` the session's hash names it, and past that a name under ``/tmp``."""
    digest = hashlib.sha256(session.encode()).hexdigest()[:16]
    folder = runtime_dir()
    for path in (folder / f"{session}.sock", folder / f"{digest}.sock"):
        if len(str(path).encode()) <= _UNIX_PATH_MAX:
            return f"unix:{path}"
    return f"unix:/tmp/relay-{os.getuid()}/{digest}.sock"


def runtime_dir() -> Path:
    """relay's private runtime folder (``$XDG_RUNTIME_DIR/relay``, else ``$TMPDIR/relay-UID``), made
    0700; refused (``PermissionError``) when it is a link, or not owned by and private to this user."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "relay" if base else Path(tempfile.gettempdir()) / f"relay-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a folder private to this user")
    return folder


class _Slot:
    """The one-waiter-per-session lock: an ``flock`` on ``NAME.waiter`` whose content is the holder's PID."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = folder / f"{name}.waiter"
        self._fd = -1

    def take(self) -> bool:
        """Take the lock, asking a current holder to go (SIGTERM) and waiting up to 5 s for it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline, asked = time.monotonic() + REPLACE_WITHIN_S, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not asked:
                    asked = _ask_to_go(os.pread(fd, 32, 0))
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _ask_to_go(content: bytes) -> bool:
    """SIGTERM the holder named in the lock file, if it is a relay waiter (checked where ``/proc`` tells)."""
    text = content.decode("ascii", "replace").strip()
    if not text.isdigit() or int(text) == os.getpid():
        return False
    pid = int(text)
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"hook" not in command or not any(name in command for name in _WAITER_COMMANDS):
            return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    return True
