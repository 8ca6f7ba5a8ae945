"""``relay`` as a real child process, and plain JSON-RPC tool calls to its /mcp/agent endpoint.

``ServeProcess`` is one ``relay serve`` (a free loopback port by default, or a unix socket), started
and stopped by PID and logging to a file; ``serve_processes`` runs several on the same arguments.
``run_relay`` runs any other ``relay`` command to completion. ``call_tool`` (async) and
``call_tool_sync`` post one stateless ``tools/call``, the way any MCP client of the 2025-11-25
revision posts it, and return the tool result. The in-process front (uvicorn in the test's own event
loop) is in ``tests/front_support.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from broker.testing.polling import wait_until
from tests.front_support import free_port

ROOT = Path(__file__).resolve().parents[1]
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
MCP_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2025-11-25",
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample on a /metrics page, keyed by (name, sorted labels)."""


def _environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``RELAY_*`` setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **(extra or {})}


def run_relay(*args: str | Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m relay ARGS`` to completion (60 s at most); output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "relay", *map(str, args)],
        cwd=ROOT,
        env=_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dashboard_login_url(base: str, key: Path) -> str:
    """A one-time dashboard login URL for the relay at ``base``, from ``relay dashboard-url``."""
    result = run_relay("dashboard-url", "--url", base, "--key-file", key)
    assert result.returncode == 0, result
    return result.stdout.strip()


class ServeProcess:
    """One ``relay serve`` child process; stdout and stderr go to ``log``.

    It listens on ``port`` (a free loopback port unless given) or, with ``uds``, on that unix socket.
    """

    def __init__(
        self, args: Sequence[str], log: Path, *, port: int | None = None, uds: Path | None = None
    ) -> None:
        self.args = list(args)
        self.log = log
        self.uds = uds
        self.port = None if uds is not None else port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return "http://localhost" if self.uds is not None else f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The agent MCP endpoint."""
        return f"{self.base}/mcp/agent"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def client(self, timeout: float = 30.0) -> httpx2.Client:
        """An HTTP client that reaches this process (through its unix socket, if it has one)."""
        transport = httpx2.HTTPTransport(uds=str(self.uds)) if self.uds is not None else None
        return httpx2.Client(transport=transport, base_url=self.base, timeout=timeout)

    def start(self, timeout: float = 30.0, *, until: str = "/readyz") -> ServeProcess:
        """Start it and wait (at most ``timeout`` seconds) until ``until`` (/readyz: the store answers
        too; /healthz: the process is up) answers 200."""
        where = ["--uds", str(self.uds)] if self.uds is not None else ["--port", str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay", "serve", *where, *self.args],
                cwd=ROOT,
                env=_environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc
        with self.client(timeout=1) as http:

            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"relay serve exited: {self.log.read_text()}")
                with contextlib.suppress(httpx2.HTTPError):
                    return http.get(until).status_code == 200
                return False

            try:
                wait_until(ready, timeout, "relay serve ready", interval=0.05)
            except AssertionError:
                self.kill()
                raise AssertionError(f"relay serve did not become ready: {self.log.read_text()}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` unless it has exited, and return its exit code. One still running after
        ``timeout`` seconds is killed, and ``subprocess.TimeoutExpired`` raised."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL, no drain: in-flight requests are cut off. Nothing happens if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def metrics(self) -> Samples:
        """Every sample on /metrics now."""
        with self.client(timeout=10) as http:
            text = http.get("/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def sample(metrics: Samples, name: str, **labels: str) -> float:
    """One sample of ``metrics`` (0 if absent)."""
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


@contextlib.contextmanager
def serve_processes(tmp: Path, count: int, *args: str) -> Iterator[list[ServeProcess]]:
    """``count`` ready ``relay serve`` processes with the same ``args``, logging to
    ``tmp/worker-N.log``; each is stopped (SIGTERM, then SIGKILL after 30 s) on the way out."""
    started = [ServeProcess(args, tmp / f"worker-{i}.log") for i in range(count)]
    try:
        for process in started:
            process.start()
        yield started
    finally:
        for process in started:
            if process.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.stop()


# --- tools/call as plain JSON-RPC -------------------------------------------------------------------


def tool_call_body(name: str, arguments: Any) -> dict[str, Any]:
    """The JSON-RPC request of one ``tools/call``."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def tool_result(response: httpx2.Response) -> dict[str, Any]:
    """The tool result (``isError`` and all) of a ``tools/call`` response, which must be a 200."""
    assert response.status_code == 200, (response.status_code, response.text[:500])
    assert "Traceback" not in response.text
    return dict(response.json()["result"])


def structured(result: dict[str, Any]) -> dict[str, Any]:
    """The structured content of a tool result that must not be an error."""
    assert not result.get("isError"), result
    return dict(result["structuredContent"])


async def call_tool(
    http: httpx2.AsyncClient, url: str, headers: Mapping[str, str], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """One ``tools/call``; returns the tool result (``isError`` and all)."""
    body = json.dumps(tool_call_body(name, arguments))
    return tool_result(await http.post(url, content=body, headers={**MCP_HEADERS, **headers}))


def call_tool_sync(
    url: str,
    headers: Mapping[str, str],
    name: str,
    arguments: dict[str, Any],
    *,
    http: httpx2.Client | None = None,
) -> dict[str, Any]:
    """``call_tool`` without an event loop: through ``http`` if given, else a new connection (30 s)."""
    body = json.dumps(tool_call_body(name, arguments))
    all_headers = {**MCP_HEADERS, **headers}
    if http is None:
        return tool_result(httpx2.post(url, content=body, headers=all_headers, timeout=30))
    return tool_result(http.post(url, content=body, headers=all_headers))


async def ok(
    http: httpx2.AsyncClient, url: str, headers: Mapping[str, str], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """``call_tool`` that must succeed; returns its structured content."""
    return structured(await call_tool(http, url, headers, name, arguments))


def ok_sync(url: str, headers: Mapping[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``call_tool_sync`` that must succeed; returns its structured content."""
    return structured(call_tool_sync(url, headers, name, arguments))


Outcome = tuple[Literal["ok", "error", "unknown"], dict[str, Any]]
"""("ok", structured content) | ("error", the tool's error JSON) | ("unknown", {"exception": ...})."""


async def tool_outcome(
    http: httpx2.AsyncClient, url: str, headers: Mapping[str, str], name: str, arguments: dict[str, Any]
) -> Outcome:
    """``call_tool`` for a client under faults: a transport failure is an unknown outcome, not an error."""
    try:
        result = await call_tool(http, url, headers, name, arguments)
    except httpx2.TransportError as exc:
        return "unknown", {"exception": type(exc).__name__}
    if result.get("isError"):
        return "error", dict(json.loads(result["content"][0]["text"])["error"])
    return "ok", dict(result["structuredContent"])


FIRST_RUN_BOUND = 60
"""Seconds a first-run ``relay serve`` (no options) has to become ready and to stop."""


def relay_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return {**env, "PYTHONPATH": str(ROOT), "RELAY_PORT": str(port)}


@contextlib.contextmanager
def first_command(folder: Path, *, creates_key: bool) -> Iterator[int]:
    """``relay serve`` with no options, run from ``folder``; yields its port once /readyz is 200."""
    port = free_port()
    log = folder.parent / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relay", "serve"], cwd=folder, env=relay_env(port), stdout=out, stderr=out
        )
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"relay serve exited: {log.read_text()}")
            with contextlib.suppress(httpx2.HTTPError):
                return httpx2.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            return False

        wait_until(ready, FIRST_RUN_BOUND, "relay serve ready", interval=0.05)
        yield port
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(FIRST_RUN_BOUND)
    assert ("created signing key" in log.read_text()) is creates_key
