"""The waiter of a Codex session: wakes it with ``codex queue`` when mail arrives (Codex 0.171).

Codex runs the folder's ``SessionStart`` hook (``relay hook codex``) with the session's ``session_id``
(its thread id) on stdin. Codex waits for a hook to finish, so the hook starts the waiter as a
detached process (``relay hook codex-wait``: its own session and process group, no terminal, output to
the runtime folder's log) and returns at once. The waiter:

1. takes the folder session's slot (one waiter per relay session: a newer Codex session's waiter asks
   the older one to go, so the newest thread is the one woken);
2. registers the relay session (``RegisterAgentAddress``), so mail is kept for it;
3. blocks on relay's mail-pending wait; for each new batch it runs ``codex queue --thread ID --message
   SUMMARY``, which starts a turn in the idle session (or queues the text behind a running one), and
   waits again. The wait announces each envelope once, so a batch wakes the session once.

``SessionEnd`` (``relay hook codex`` again) asks the waiter of the session to go, and the waiter leaves
within a second of the process that ran the hook (``$PPID``: the daemon, or an interactive ``codex``)
ending, first telling relay the session ended (``POST /agent/leave``: its presence reads ``gone``).
A refusal from relay
(a revoked credential, a session taken over elsewhere) ends it quietly; a relay that is down is retried
with backoff; after ``LIFETIME_S`` it ends (a later ``SessionStart`` starts a new one).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from relay.claude_code import relay_http
from relay.claude_code.session import ClaudeProcess, NoSuchProcess
from relay.claude_code.summary import summary
from relay.claude_code.waiter import _ask_to_go, _Slot, _watch, leave, runtime_dir, session_endpoint

LIFETIME_S: Final = 7 * 86_400
WAIT_CHUNK_S: Final = 60.0
BACKOFF_FIRST_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
QUEUE_TIMEOUT_S: Final = 60.0
_THREAD_CHARS: Final = frozenset("0123456789abcdefABCDEF-")


class _Asked(BaseException):
    """A newer waiter (or ``SessionEnd``) asked this one to go (SIGTERM)."""


@dataclass(frozen=True, slots=True)
class CodexWait:
    agent: str
    mcp_url: str
    wait_url: str
    session: str
    """The relay session (the folder's, ``relay.codex.setup.session_id``)."""
    thread: str
    """Codex's ``session_id``: what ``codex queue --thread`` wakes."""
    codex: str
    """The ``codex`` command to run."""
    headers: Callable[[str], Mapping[str, str]]
    lifetime_s: float = LIFETIME_S
    watch: int | None = None
    """The process whose end ends the waiter (the daemon or ``codex`` that ran the hook; opencode)."""
    wake: Callable[[str], bool] | None = None
    """What to do with relay's summary instead of ``codex queue`` (opencode's plugin reads it as a line
    on stdout: ``wake_line``); whether to go on waiting."""


def thread_id(hook_input: Mapping[str, Any]) -> str | None:
    """The Codex session id of a hook's input, when it looks like one (a UUID)."""
    value = hook_input.get("session_id")
    if isinstance(value, str) and 8 <= len(value) <= 64 and set(value) <= _THREAD_CHARS:
        return value
    return None


def slot(agent: str, session: str) -> _Slot:
    return _Slot(runtime_dir(), f"{agent}.{session}")


def log_path(agent: str, session: str) -> Path:
    return runtime_dir() / f"{agent}.{session}.codex.log"


def start_detached(argv: Sequence[str], log: Path) -> int:
    """Start ``argv`` in a session of its own (no terminal, stdin closed, output appended to ``log``),
    so it outlives the hook that started it; its PID."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    return proc.pid


def stop(agent: str, session: str) -> bool:
    """Ask the waiter holding the session's slot to go (``SessionEnd``); whether one was asked."""
    path = slot(agent, session).path
    try:
        content = path.read_bytes()[:32]
    except OSError:
        return False
    return _ask_to_go(content)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Asked


def run(options: CodexWait, log: IO[str]) -> int:
    """Wait and wake as described above; exit status 0 (it never wakes anything by its status)."""
    held = slot(options.agent, options.session)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if not held.take():
            _say(log, "another waiter for this session would not give way")
            return 0
        if options.watch is not None:
            try:
                ended = functools.partial(leave, options.wait_url, options.headers, options.session)
                _watch(ClaudeProcess.of(options.watch), ended)
            except NoSuchProcess:
                _say(log, f"process {options.watch} is gone already")
                return 0
        _say(log, f"waiting for mail of {options.agent} (session {options.session}, thread {options.thread})")
        return _loop(options, log)
    except _Asked:
        _say(log, "asked to go (a newer session, or the session ended)")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        held.release()


def _loop(options: CodexWait, log: IO[str]) -> int:
    deadline = time.monotonic() + options.lifetime_s
    delay, registered = BACKOFF_FIRST_S, False
    endpoint = session_endpoint(options.session)
    while (left := deadline - time.monotonic()) > 0:
        try:
            if not registered:
                relay_http.register(options.mcp_url, options.headers(options.session), endpoint)
                registered = True
            pending = relay_http.wait(
                options.wait_url, options.headers(options.session), int(min(left, WAIT_CHUNK_S) * 1000)
            )
        except relay_http.Refused as exc:
            _say(log, f"relay refused: {exc}")
            return 0
        except relay_http.Unavailable as exc:
            _say(log, f"relay unavailable ({exc}); retrying")
            time.sleep(min(delay * random.uniform(0.5, 1.0), max(left, 0)))
            delay = min(delay * 2, BACKOFF_MAX_S)
            continue
        except Exception as exc:  # a credential file gone bad, ...: logged, never in front of the model
            _say(log, f"{type(exc).__name__}: {exc}")
            return 0
        delay = BACKOFF_FIRST_S
        wake = options.wake or (lambda text: _queue(options, text, log))
        if pending.count > 0 and not wake(summary(options.agent, pending.answer)):
            return 0
    _say(log, f"lifetime of {options.lifetime_s:.0f} s over; the next SessionStart starts a new waiter")
    return 0


def _queue(options: CodexWait, text: str, log: IO[str]) -> bool:
    """``codex queue --thread ID --message TEXT``; whether the thread took it."""
    argv = [options.codex, "queue", "--thread", options.thread, "--message", text]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=QUEUE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _say(log, f"codex queue did not run: {exc}")
        return False
    _say(log, f"codex queue exited {done.returncode}: {(done.stdout + done.stderr).strip()[-500:]}")
    return done.returncode == 0


def wake_line(text: str) -> bool:
    """Print relay's summary as one JSON line on stdout (``{"summary": TEXT}``); False when no one reads."""
    try:
        print(json.dumps({"summary": text}), flush=True)
    except (BrokenPipeError, OSError, ValueError):
        return False
    return True


def _say(log: IO[str], text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(
            f"{time.strftime('%Y-%m-%dT%H:%M:%S')} relay hook codex-wait[{os.getpid()}]: {text}",
            file=log,
            flush=True,
        )


def relay_argv() -> list[str]:
    """How this process was started as ``relay`` (to start the detached waiter the same way)."""
    script = Path(sys.argv[0])
    if script.name == "relay" and script.is_file():
        return [str(script.resolve())]
    return [sys.executable, "-m", "relay"]
