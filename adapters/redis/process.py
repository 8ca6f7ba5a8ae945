"""Local process plumbing for the embedded server: loopback addresses and free ports, the PING probe
that tells whose server answers on a port, log tails for error messages, and a server that dies with
the process that started it."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from broker.addresses import is_loopback_host

LOG_TAIL_LINES = 20


def normalize_host(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"host must be a loopback IP address, got {host!r}") from None
    if not is_loopback_host(host):
        raise ValueError(f"refusing to bind the embedded Redis to non-loopback address {host!r}")
    return str(addr)


def family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_is_free(host: str, port: int) -> bool:
    # SO_REUSEADDR mirrors what redis does, so TIME_WAIT leftovers don't count as "taken".
    with socket.socket(family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(host: str) -> int:
    with socket.socket(family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


def read_reply_line(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\r\n")
    buf[:] = rest
    return line


def probe_server(host: str, port: int, timeout: float) -> int | None:
    """PING the server; if it answers PONG, return the process_id from INFO server, else None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            buf = bytearray()
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            if read_reply_line(sock, buf) != b"+PONG":
                return None  # e.g. -LOADING while the AOF is replayed
            sock.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            header = read_reply_line(sock, buf)
            if not header.startswith(b"$"):
                return None
            size = int(header[1:])
            while len(buf) < size:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            m = re.search(rb"^process_id:(\d+)", bytes(buf[:size]), re.MULTILINE)
            return int(m.group(1)) if m else None
    except (OSError, ValueError):
        return None


def log_tail(path: Path, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return "(no server log)"
    text = data.decode("utf-8", "replace").rstrip()
    return "\n".join(text.splitlines()[-lines:]) or "(server log is empty)"


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """On Linux: a ``preexec_fn`` that makes the kernel SIGTERM the server when the process that
    started it dies, SIGKILL and the OOM killer included. An orphaned server would otherwise keep
    running and keep its data dir locked, so ``relay serve`` could not start again until someone
    killed it by hand; on SIGTERM it flushes its append-only file and exits, releasing the lock.
    (The kernel watches the thread that started the server: ``relay serve`` and the tests start it on
    the main thread.)"""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return set_parent_death_signal
