"""Which relay session a running Claude Code session is.

Claude Code runs the MCP ``headersHelper`` and every command hook through a shell, as children of its
own process, so ``$PPID`` in those commands is the Claude Code process: both the helper (whose
environment carries no Claude Code session id) and the hooks name the same process. relay's session id
is derived from that process's id and its start time: stable while the process lives, different for
the next one (a restarted session supersedes the old one and keeps the inbox), and never reused by a
later process that happens to get the same PID.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker.ids import check_session_id

PREFIX: Final = "claude-"
_PROC: Final = Path("/proc/self/stat")


class NoSuchProcess(LookupError):
    """The Claude Code process is not (or no longer) running."""


@dataclass(frozen=True, slots=True)
class ClaudeProcess:
    """One running Claude Code process: its PID and an opaque start mark."""

    pid: int
    started: str

    @classmethod
    def of(cls, pid: int) -> ClaudeProcess:
        """The process ``pid`` as it runs now; ``NoSuchProcess`` when there is none."""
        if pid <= 1:
            raise NoSuchProcess(f"process {pid} is not a Claude Code process")
        started = _start_mark(pid)
        if started is None:
            raise NoSuchProcess(f"no process {pid} is running")
        return cls(pid, started)

    @property
    def session_id(self) -> str:
        """The relay session id of this Claude Code session, e.g. ``claude-4242-118733``."""
        return check_session_id(f"{PREFIX}{self.pid}-{self.started}")

    def alive(self) -> bool:
        """Still running (the same process, not a later one with the same PID)."""
        return _start_mark(self.pid) == self.started


def _start_mark(pid: int) -> str | None:
    """The process's start time: clock ticks since boot from ``/proc`` (Linux), else a digest of what
    ``ps -o lstart=`` says. ``None`` when no such process is running (zombies count as gone)."""
    if not _PROC.exists():
        return _ps_start_mark(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def _ps_start_mark(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    shown = subprocess.run(
        ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
    ).stdout.strip()
    return hashlib.sha256(shown.encode()).hexdigest()[:12] if shown else None
