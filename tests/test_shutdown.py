"""Stopping ``relay serve``: SIGTERM or Ctrl-C answers parked long-polls at once (empty, not after
their 20 s) and the process exits cleanly well before compose's SIGKILL; a second Ctrl-C stops at once
without a traceback. (How long a stop takes is measured, not asserted: docs/reliability.md.)"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, call_tool_sync, ok_sync, sample

STOP_WITHIN = 10.0
"""docker compose's stop timeout: a stop that takes longer ends in SIGKILL."""


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    key = key_file(tmp_path)
    process = ServeProcess(
        ["--data-dir", str(tmp_path / "data"), "--agent-mcp-key-file", str(key)], tmp_path / "serve.log"
    )
    process.key = key  # type: ignore[attr-defined]
    yield process.start()
    process.kill()


def park_a_poll(serve: ServeProcess) -> tuple[threading.Thread, dict[str, Any]]:
    """Register an agent and park its ``FetchAgentInbox {"wait_ms": 20000}`` in a thread; returns
    once the wait is parked (``csf_relay_long_polls_parked`` shows it)."""
    headers = agent_headers(load_key_file(serve.key), "parker", "parker-1")  # type: ignore[attr-defined]
    ok_sync(serve.url, headers, "RegisterAgentAddress", REGISTER)
    outcome: dict[str, Any] = {}

    def fetch() -> None:
        outcome["result"] = call_tool_sync(serve.url, headers, "FetchAgentInbox", {"wait_ms": 20000})

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    wait_until(lambda: parked(serve) >= 1, 10, "the fetch parked", interval=0.05)
    return thread, outcome


def parked(serve: ServeProcess) -> float:
    return sample(serve.metrics(), "csf_relay_long_polls_parked")


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGINT, signal.SIGINT]])
def test_a_stop_answers_parked_polls_at_once_and_exits_cleanly(
    serve: ServeProcess, signals: list[signal.Signals]
) -> None:
    thread, outcome = park_a_poll(serve)
    assert serve.proc is not None
    for sig in signals:
        serve.proc.send_signal(sig)
    assert serve.proc.wait(STOP_WITHIN) == 0
    thread.join(STOP_WITHIN)
    assert outcome["result"]["structuredContent"] == {"envelopes": []}
    log = serve.log.read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert "relay stopped" in log and "embedded server stopped" in log
