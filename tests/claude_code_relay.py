"""Claude Code against a real ``relay serve``: the server with a signing key, and folders set up by
``relay setup claude-code`` (the real command, as a child process)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.front.key_file import write_key_file
from tests.processes import ServeProcess, run_relay


@contextlib.contextmanager
def relay_serving(tmp: Path, redis_url: str) -> Iterator[tuple[ServeProcess, Path]]:
    """``relay serve`` on a free loopback port with a new signing key; yields it and the key file."""
    key = tmp / "keys" / "relay.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    write_key_file(key)
    serve = ServeProcess(["--redis-url", redis_url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
    serve.start()
    try:
        yield serve, key
    finally:
        with contextlib.suppress(Exception):
            serve.stop()


def set_up(folder: Path, url: str, agent: str, redis_url: str) -> str:
    """Run ``relay setup claude-code`` for ``folder`` (created if needed), issuing its credential in the
    store at ``redis_url``; return what it printed."""
    folder.mkdir(parents=True, exist_ok=True)
    done = run_relay(
        "setup", "claude-code", "--url", url, "--agent", agent, "--redis-url", redis_url, "--dir", folder
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2))


def mcp_status(listing: str, name: str) -> str:
    """The status part of ``NAME: URL (HTTP) - STATUS`` in ``claude mcp list`` output ("" if absent)."""
    for line in listing.splitlines():
        if line.startswith(f"{name}: "):
            return line.rpartition(" - ")[2]
    return ""
