"""What an embedded server leaves in its data dir, written and read here only.

- ``server.lock`` (``LOCK_FILE``): locked with ``flock`` by the starter and inherited by the server
  while it runs; it holds the server's pid.
- ``embedded-server.json`` (``EMBEDDED_STATE_FILE``): the address the server last listened on and which
  server (kind, version) last wrote the data, so a restart reuses the port and a command run elsewhere
  (``relay inspect``, ``relay show``) finds the running server.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_STATE_FILE = "embedded-server.json"
LOCK_FILE = "server.lock"


@dataclass(frozen=True, slots=True)
class ServerState:
    host: str | None
    port: int | None
    kind: str | None
    version: str | None


def read_state(data_dir: Path) -> ServerState | None:
    """The state file of ``data_dir``, None when missing or unreadable; a field of the wrong type is
    None."""
    try:
        state = json.loads((data_dir / EMBEDDED_STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    host, port = state.get("host"), state.get("port")
    kind, version = state.get("kind"), state.get("version")
    return ServerState(
        host if isinstance(host, str) else None,
        port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None,
        kind if isinstance(kind, str) else None,
        version if isinstance(version, str) else None,
    )


def write_state(data_dir: Path, state: ServerState) -> None:
    """Replace the state file at once (a reader never sees half of it). Not fatal when it cannot be
    written: the next start picks another free port."""
    path = data_dir / EMBEDDED_STATE_FILE
    payload = json.dumps(
        {"port": state.port, "host": state.host, "kind": state.kind, "version": state.version}
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(payload + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not record embedded redis port in %s: %s", path, exc)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs now (someone else's included). A zombie does not: an embedded
    server orphaned by a killed ``relay serve`` has exited, but stays a zombie for as long as nothing
    reaps it (in a container whose first process does not reap, for good)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive or a zombie, someone else's
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(0) is all there is
    return state not in ("Z", "X")


def running_server_url(data_dir: Path) -> str | None:
    """The URL of the embedded server running from ``data_dir`` now, else None: the lock file names the
    server's pid (a live process) and the state file its address. Read-only: no lock is taken, so a
    ``relay serve`` starting meanwhile is never disturbed."""
    try:
        owner = int((data_dir / LOCK_FILE).read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    state = read_state(data_dir)
    if owner <= 0 or state is None or not process_alive(owner):
        return None
    if state.host is None or state.port is None:
        return None
    return f"redis://{f'[{state.host}]' if ':' in state.host else state.host}:{state.port}/0"
