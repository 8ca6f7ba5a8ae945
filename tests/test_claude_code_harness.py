"""The offline Claude Code harness, proved with a plain stub hook: an ``asyncRewake`` command hook that
exits 2 wakes an idle interactive session, and the fake Messages API sees the hook's line.

Skipped where Claude Code is not installed (``scripts/install-claude-code``; CI installs it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.testing.polling import wait_until
from tests.agent_clis import WAKE_BOUND_S
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture
from tests.fake_anthropic import FakeAnthropic

__all__ = ["claude_binary_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WAKE_LINE = "stub-wake: the flag file appeared"
WAKE_WITHIN_S = WAKE_BOUND_S

# Waits (at most 60 s) for the flag file, then says one line on stderr and exits 2. It leaves a file named
# after its PID in ARMED first, so the test knows a waiter is running before it raises the flag.
STUB_HOOK = f"""#!/bin/sh
cat > /dev/null
touch "$ARMED/$$"
i=0
while [ ! -e "$FLAG" ]; do
  sleep 0.1
  i=$((i + 1))
  if [ $i -ge 600 ]; then exit 0; fi
done
rm -f "$FLAG"
echo "{WAKE_LINE}" >&2
exit 2
"""


def _project(tmp_path: Path, event: str) -> tuple[Path, Path, Path]:
    """A project folder whose only hook is the stub on ``event``; returns (folder, flag, armed dir)."""
    project, armed = tmp_path / "project", tmp_path / "armed"
    (project / ".claude").mkdir(parents=True)
    armed.mkdir()
    hook = tmp_path / "stub-hook.sh"
    hook.write_text(STUB_HOOK)
    hook.chmod(0o755)
    flag = tmp_path / "flag"
    command = f"ARMED={armed} FLAG={flag} {hook}"
    settings = {
        "hooks": {
            event: [{"hooks": [{"type": "command", "command": command, "asyncRewake": True, "timeout": 120}]}]
        }
    }
    (project / ".claude" / "settings.local.json").write_text(json.dumps(settings))
    return project, flag, armed


def _woken(api: FakeAnthropic, flag: Path, before: int) -> float:
    """Raise the flag; return how long until the fake API got a conversation request with the line."""
    raised = time.monotonic()
    flag.touch()
    request = api.wait_for(
        lambda r: r.is_conversation and WAKE_LINE in r.last_user_text(),
        WAKE_WITHIN_S * 2,
        after=before,
        what="carrying the hook's line",
    )
    return request.at - raised


def test_an_async_rewake_stop_hook_wakes_an_idle_session(claude_binary: Path, tmp_path: Path) -> None:
    project, flag, armed = _project(tmp_path, "Stop")
    with FakeAnthropic() as api:
        home = ClaudeHome(tmp_path / "home", api_url=api.base_url, trusted=[project]).write()
        with InteractiveClaude(claude_binary, home, project, "hello") as session:
            api.wait_for(lambda r: r.is_conversation, 60, what="for the first turn")
            wait_until(lambda: any(armed.iterdir()), 60, "the Stop hook's waiter started")
            before = len(api.requests)
            assert not any(r.is_conversation for r in api.requests[before:])  # idle: nothing in flight

            took = _woken(api, flag, before)

            assert took < WAKE_WITHIN_S, f"woken after {took:.1f} s"
            assert session.alive()


def test_an_async_rewake_session_start_hook_wakes_a_fresh_session(
    claude_binary: Path, tmp_path: Path
) -> None:
    project, flag, armed = _project(tmp_path, "SessionStart")
    with FakeAnthropic() as api:
        home = ClaudeHome(tmp_path / "home", api_url=api.base_url, trusted=[project]).write()
        with InteractiveClaude(claude_binary, home, project) as session:
            wait_until(lambda: any(armed.iterdir()), 60, "the SessionStart hook's waiter started")
            assert api.conversation() == []  # a fresh session: no turn yet

            took = _woken(api, flag, 0)

            assert took < WAKE_WITHIN_S, f"woken after {took:.1f} s"
            assert session.alive()
