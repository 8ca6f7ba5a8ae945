"""Which ``relay serve`` runs from a data dir: its pid and the URL it serves (``relay-serve.json``).

``relay serve`` with an embedded server (no ``--redis-url``) writes the file once that server runs, and
removes it when it stops. A second ``relay serve`` in the same folder reads it to say that relay already
runs there (pid and URL) instead of failing on the embedded server's lock, and the shell commands read
it to reach the running relay without ``--url``. A file is believed only while its pid is alive and the
embedded server of the same data dir runs (``running_server_url``): one left by a relay that was killed
says nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from adapters.redis.embedded_state import process_alive, running_server_url

STATE_FILE: Final = "relay-serve.json"


@dataclass(frozen=True, slots=True)
class Running:
    pid: int
    url: str | None
    """The base URL clients use (``http://127.0.0.1:8080``); None for a unix socket or port 0."""


def client_url(host: str, port: int, uds: Path | None) -> str | None:
    """The base URL a client on this host reaches a listener on ``host:port`` at (None for a unix
    socket, or port 0, whose port is known only once bound)."""
    if uds is not None or port == 0:
        return None
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def running(data_dir: Path) -> Running | None:
    """The ``relay serve`` running from ``data_dir`` now, else None. Read-only."""
    try:
        state = json.loads((data_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("pid") if isinstance(state, dict) else None
    url = state.get("url") if isinstance(state, dict) else None
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or not process_alive(pid):
        return None
    if running_server_url(data_dir) is None:
        return None
    return Running(pid, url if isinstance(url, str) and url.startswith("http") else None)


def announce(data_dir: Path, url: str | None) -> None:
    """Record this process as the ``relay serve`` of ``data_dir`` (written aside, then renamed)."""
    path = data_dir / STATE_FILE
    aside = path.with_name(f".{STATE_FILE}.{os.getpid()}.new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"pid": os.getpid(), "url": url}) + "\n")
    os.replace(aside, path)


def withdraw(data_dir: Path) -> None:
    """Remove the record, if it is this process's."""
    path = data_dir / STATE_FILE
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
