"""``relay history`` and ``relay search`` as child processes, against a real ``relay serve`` and a Redis
started for this module; agents act over real HTTP (MCP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, ok_sync, run_relay


class Shell:
    def __init__(self, serve: ServeProcess, redis_url: str, key: Path) -> None:
        self.serve = serve
        self.key = key
        self.env = {"RELAY_URL": serve.base, "RELAY_KEY_FILE": str(key), "RELAY_REDIS_URL": redis_url}

    def ok(self, *args: str) -> str:
        result = run_relay(*args, env=self.env)
        assert result.returncode == 0, result
        assert "Traceback" not in result.stderr
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def agent(self, name: str) -> dict[str, str]:
        headers = agent_headers(load_key_file(self.key), name, "s-1")
        ok_sync(self.serve.url, headers, "RegisterAgentAddress", REGISTER)
        return headers

    def call(self, headers: dict[str, str], tool: str, arguments: dict[str, Any]) -> Any:
        return ok_sync(self.serve.url, headers, tool, arguments)


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    tmp = tmp_path_factory.mktemp("history")
    redis = EmbeddedRedis()
    redis.start()
    key = key_file(tmp)
    serve = ServeProcess(["--redis-url", redis.url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
    try:
        serve.start()
        yield Shell(serve, redis.url, key)
    finally:
        serve.kill()
        redis.stop()


def _converse(shell: Shell) -> tuple[str, str, str]:
    """ann asks ben, ben answers, cyd tells ben something; both acknowledge everything."""
    ann, ben, cyd = shell.agent("ann"), shell.agent("ben"), shell.agent("cyd")
    ask = shell.call(
        ann, "SendAgentMessage", {"to": "ben", "message": {"kind": "request", "text": "Deploy the API?"}}
    )
    aside = shell.call(
        cyd, "SendAgentMessage", {"to": "ben", "message": {"kind": "note", "text": "lunch at noon"}}
    )
    got = shell.call(ben, "FetchAgentInbox", {"limit": 8})["envelopes"]
    reply = {"kind": "reply", "text": "api deployed", "in_reply_to": ask["id"]}
    answer = shell.call(ben, "SendAgentMessage", {"to": "ann", "message": reply})
    shell.call(ben, "AcknowledgeAgentInbox", {"ids": [e["id"] for e in got]})
    shell.call(ann, "FetchAgentInbox", {"limit": 8})
    shell.call(ann, "AcknowledgeAgentInbox", {"ids": [answer["id"]]})
    return ask["id"], answer["id"], aside["id"]


def test_history_shows_what_was_acknowledged_and_the_thread_stays_whole(shell: Shell) -> None:
    ask, answer, aside = _converse(shell)  # the first test of the module: these histories are new
    ben = shell.json("history", "--agent", "ben")
    assert [e["id"] for e in ben["entries"]] == [ask, aside] and ben["next"] is None
    assert {e["outcome"] for e in ben["entries"]} == {"acknowledged"}
    assert ben["entries"][0]["message"]["text"] == "Deploy the API?"
    assert [e["id"] for e in shell.json("history", "--agent", "ben", "--kind", "note")["entries"]] == [aside]
    # the conversation with ann, both ways: what ann sent ben and what ben sent ann
    both = shell.json("history", "--agent", "ben", "--with", "ann")
    assert [e["id"] for e in both["entries"]] == [ask, answer]
    assert [e["id"] for e in shell.json("history", "--agent", "ben", "--since", "1h")["entries"]] == [
        ask,
        aside,
    ]
    assert shell.json("history", "--agent", "ben", "--until", "2000-01-01")["entries"] == []
    assert [e["id"] for e in shell.json("thread", ask)["envelopes"]] == [ask, answer]
    text = shell.ok("history", "--agent", "ben", "--limit", "1")
    assert text.startswith("history of ben: 1 entry, oldest first") and "acknowledged at " in text
    assert "more: run it again with --after " in text
    cursor = text.rsplit("--after ", 1)[1].strip()
    rest = shell.json("history", "--agent", "ben", "--after", cursor)
    assert [e["id"] for e in rest["entries"]] == [aside]


def test_search_matches_words_in_any_case_and_only_where_asked(shell: Shell) -> None:
    ask, answer, _ = _converse(shell)
    found = shell.json("search", "API", "deploy")
    assert ask in [e["id"] for e in found["entries"]]
    assert answer not in [e["id"] for e in found["entries"]]  # "deployed" is another word
    assert answer in [e["id"] for e in shell.json("search", "deployed", "--agent", "ann")["entries"]]
    assert shell.json("search", "deployed", "--agent", "ben")["entries"] == []


def test_history_refuses_what_it_cannot_read(shell: Shell) -> None:
    shell.agent("dot")
    for args, said in (
        (["history", "--agent", "dot", "--since", "yesterday"], "--since"),
        (["history", "--agent", "dot", "--after", "1-2-3"], "--after"),
        (["history", "--agent", "dot", "--since", "1h", "--until", "2h"], "--since is after --until"),
        (["history", "--agent", "Not An Id"], "--agent"),
        (["search", "!!!"], "no word"),
        (["search", "x", "--after", "1-0"], "--agent"),
    ):
        result = run_relay(*args, env=shell.env)
        assert result.returncode == 2, result
        assert said in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
