"""The wake path end to end with the real client: two folders set up by ``relay setup claude-code``
(author and reviewer), ``relay serve`` running, an interactive Claude Code session in each, each at its
own fake Messages API. The author's session is idle; the reviewer's model answers it over MCP
(``SendAgentMessage``); the author's fake API must receive a new model request carrying relay's
summary within a few seconds, and the author's model then reads the message with ``FetchAgentInbox``.
No one types in the author's session. The author's waiter blocks on relay's own ``POST /agent/wait``.
``.mcp.json`` holds no bearer token and ``git status`` shows no secret.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from adapters.redis.keys import Keys
from broker.testing.polling import wait_until
from tests.agent_clis import WAKE_BOUND_S
from tests.claude_code import ClaudeHome, InteractiveClaude, claude_binary_fixture
from tests.claude_code_relay import read_json, relay_serving, set_up
from tests.fake_anthropic import FakeAnthropic, Text, ToolUse

__all__ = ["claude_binary_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WAKE_WITHIN_S = WAKE_BOUND_S
ANSWER = "Approved: ship PR 12 once the changelog names the new flag."


@contextlib.contextmanager
def _git_repo(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)
    yield folder


def test_the_reviewers_answer_wakes_the_idle_authors_session(
    claude_binary: Path, tmp_path: Path, redis_url: str, store: redis.Redis
) -> None:
    with (
        relay_serving(tmp_path, redis_url) as (relay, key),
        _git_repo(tmp_path / "author") as author,
        _git_repo(tmp_path / "reviewer") as reviewer,
        FakeAnthropic() as author_api,
        FakeAnthropic() as reviewer_api,
    ):
        suffix = str(time.monotonic_ns())[-6:]  # agent ids of their own on the shared test Redis
        author_id, reviewer_id = f"author-{suffix}", f"reviewer-{suffix}"
        set_up(author, relay.url, author_id, redis_url)
        set_up(reviewer, relay.url, reviewer_id, redis_url)
        home = ClaudeHome(
            tmp_path / "home", trusted=[author, reviewer], settings={"permissions": {"allow": ["mcp__relay"]}}
        ).write()
        author_api.reply(ToolUse("mcp__relay__FetchAgentInbox", {}))
        author_api.reply(Text("Read the review."))
        note = {"kind": "note", "text": ANSWER}
        reviewer_api.reply(ToolUse("mcp__relay__SendAgentMessage", {"to": author_id, "message": note}))
        reviewer_api.reply(Text("Sent."))

        with InteractiveClaude(
            claude_binary, home, author, env={"ANTHROPIC_BASE_URL": author_api.base_url}
        ) as session:
            registered = Keys().registration(author_id)
            wait_until(
                lambda: store.hget(registered, "session"), 60, "the author's SessionStart hook registered it"
            )
            assert author_api.conversation() == []  # idle: nobody typed, nothing in flight
            with InteractiveClaude(
                claude_binary,
                home,
                reviewer,
                "Tell the author the review result.",
                env={"ANTHROPIC_BASE_URL": reviewer_api.base_url},
            ):
                woken = author_api.wait_for(
                    lambda r: r.is_conversation and f"new message for {author_id}" in r.last_user_text(),
                    60,
                    what="carrying relay's summary",
                )
                # the reviewer's model asked for the send when the fake API answered its first turn: an
                # upper bound of the time from the send to the author's wake
                asked = reviewer_api.conversation()[0].at
                took = woken.at - asked
                fetched = author_api.wait_for(
                    lambda r: ANSWER in r.last_user_text() and '"envelopes"' in r.last_user_text(),
                    60,
                    what="with the fetched message",
                )
            assert session.alive()

        summary = woken.last_user_text()
        assert f"from {reviewer_id} (note, " in summary and f'"{ANSWER}"' in summary
        assert (
            f'blocking error from command "SessionStart:startup": relay: 1 new message for {author_id}'
            in summary
        )
        assert "Call FetchAgentInbox" in summary
        assert took < WAKE_WITHIN_S, f"woken {took:.2f} s after the reviewer's model asked to send"
        compact = fetched.last_user_text().replace(" ", "")
        assert f'"from":"{reviewer_id}"' in compact
        assert '"deliveries":1' in compact  # the wait that woke the session delivered nothing
        for folder in (author, reviewer):
            assert "Bearer" not in (folder / ".mcp.json").read_text()
            assert "headers" not in read_json(folder / ".mcp.json")["mcpServers"]["relay"]
            status = subprocess.run(
                ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=all"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout
            assert status.split() == ["??", ".gitignore"], status
            assert key.read_text().splitlines()[-1] not in (folder / ".gitignore").read_text()
