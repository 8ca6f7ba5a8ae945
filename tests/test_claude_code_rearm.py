"""A session stays reachable past its waiter's timeout, with the real client.

Claude Code stops an ``asyncRewake`` hook at the hook's ``timeout`` (SIGTERM) and does not wake the
session; only the end of a turn arms the ``Stop`` hook again. So relay's waiter, when its own
``--timeout`` (a minute below the hook's) passes with no mail, wakes the session once with a notice that
there is nothing to do, and the turn's ``Stop`` hook waits again. Here the ``SessionStart`` waiter of a
folder set up by ``relay setup claude-code`` gets a 4 s ``--timeout``: the session is woken once by the
notice, and mail sent after that still wakes it. Skipped where Claude Code is not installed.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from relay.claude_code.setup import WAITER_TIMEOUT_S
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture
from tests.claude_code_relay import read_json, relay_serving, set_up, write_json
from tests.fake_anthropic import FakeAnthropic
from tests.processes import REGISTER, ROOT, ok_sync

__all__ = ["claude_binary_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SHORT_TIMEOUT_S = 4

# Waits until it gets SIGTERM (at most 120 s), noting its start and the signal in $LOG.
SLEEPER = """#!/bin/bash
cat > /dev/null
echo start >> "$LOG"
trap 'echo TERM >> "$LOG"; exit 0' TERM
for i in $(seq 1 1200); do sleep 0.1; done
exit 2
"""


def test_claude_code_stops_a_hook_at_its_timeout_and_does_not_wake_the_session(
    claude_binary: Path, tmp_path: Path
) -> None:
    project, log = tmp_path / "project", tmp_path / "hook.log"
    (project / ".claude").mkdir(parents=True)
    hook = tmp_path / "sleeper.sh"
    hook.write_text(SLEEPER)
    hook.chmod(0o755)
    entry = {"type": "command", "command": f"LOG={log} {hook}", "asyncRewake": True, "timeout": 3}
    write_json(project / ".claude" / "settings.local.json", {"hooks": {"SessionStart": [{"hooks": [entry]}]}})
    with FakeAnthropic() as api:
        home = ClaudeHome(tmp_path / "home", api_url=api.base_url, trusted=[project]).write()
        with InteractiveClaude(claude_binary, home, project) as session:
            wait_until(lambda: log.exists() and "TERM" in log.read_text(), 60, "the hook stopped at 3 s")
            assert log.read_text().split() == ["start", "TERM"]
            assert api.conversation() == []  # stopped, not woken
            assert session.alive()


def test_a_waiter_that_runs_out_wakes_the_session_once_and_mail_still_wakes_it(
    claude_binary: Path, tmp_path: Path, redis_url: str
) -> None:
    suffix = str(time.monotonic_ns())[-6:]  # agent ids of their own on the shared test Redis
    author, reviewer = f"author-{suffix}", f"reviewer-{suffix}"
    with relay_serving(tmp_path, redis_url) as (relay, key), FakeAnthropic() as api:
        folder = tmp_path / "author"
        set_up(folder, relay.url, author, redis_url)
        settings_file = folder / ".claude" / "settings.local.json"
        settings = read_json(settings_file)
        (start,) = settings["hooks"]["SessionStart"][0]["hooks"]
        assert f"--timeout {WAITER_TIMEOUT_S} " in start["command"]
        start["command"] = re.sub(r"--timeout \d+", f"--timeout {SHORT_TIMEOUT_S}", start["command"])
        write_json(settings_file, settings)  # the Stop hook keeps setup's own timeout
        home = ClaudeHome(tmp_path / "home", api_url=api.base_url, trusted=[folder]).write()

        # the hooks run this checkout's relay, whatever `python -m relay` finds installed
        with InteractiveClaude(claude_binary, home, folder, env={"PYTHONPATH": str(ROOT)}) as session:
            notice = api.wait_for(
                lambda r: r.is_conversation and f"no new mail for {author}" in r.last_user_text(),
                90,
                what="carrying the waiter's re-arming notice",
            )
            assert "Nothing to do" in notice.last_user_text()
            assert "SessionStart" in notice.last_user_text()

            headers = agent_headers(load_key_file(key), reviewer, "r-1")
            ok_sync(relay.url, headers, "RegisterAgentAddress", REGISTER)
            note = {"to": author, "message": {"kind": "note", "text": "still there?"}}
            ok_sync(relay.url, headers, "SendAgentMessage", note)
            woken = api.wait_for(
                lambda r: r.is_conversation and f"new message for {author}" in r.last_user_text(),
                90,
                what="carrying relay's summary, from the waiter the Stop hook armed again",
            )
            assert '"still there?"' in woken.last_user_text()
            assert session.alive()
        notices = [r for r in api.conversation() if f"no new mail for {author}" in r.last_user_text()]
        assert len(notices) == 1, json.dumps([r.last_user_text()[-300:] for r in notices])
