"""``relay agents retire`` and ``relay inbox purge`` as child processes, against a real ``relay serve``
and a Redis started for this module; agents act over real HTTP (MCP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.paths import LEAVE_PATH, WAIT_PATH
from broker.front.tokens import agent_headers
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, call_tool_sync, ok_sync, run_relay


class Shell:
    def __init__(self, serve: ServeProcess, redis_url: str, key: Path) -> None:
        self.serve = serve
        self.key = key
        self.env = {"RELAY_URL": serve.base, "RELAY_KEY_FILE": str(key), "RELAY_REDIS_URL": redis_url}

    def run(self, *args: str, code: int = 0) -> str:
        result = run_relay(*args, env=self.env)
        assert result.returncode == code, result
        assert "Traceback" not in result.stderr
        return result.stdout if code == 0 else result.stderr

    def agent(self, name: str) -> dict[str, str]:
        headers = agent_headers(load_key_file(self.key), name, "s-1")
        ok_sync(self.serve.url, headers, "RegisterAgentAddress", REGISTER)
        return headers

    def send(self, headers: dict[str, str], to: str, text: str) -> str:
        arguments = {"to": to, "message": {"kind": "note", "text": text}}
        return str(ok_sync(self.serve.url, headers, "SendAgentMessage", arguments)["id"])

    def refused(self, headers: dict[str, str], tool: str, arguments: dict[str, Any]) -> str:
        result = call_tool_sync(self.serve.url, headers, tool, arguments)
        assert result.get("isError"), result
        return str(json.loads(result["content"][0]["text"])["error"]["code"])

    def states(self, headers: dict[str, str], ids: list[str]) -> list[str]:
        found = ok_sync(self.serve.url, headers, "GetMessageStatus", {"ids": ids})["statuses"]
        return [s["state"] for s in found]


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    tmp = tmp_path_factory.mktemp("lifecycle")
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


def test_retire_refuses_the_agent_and_keeps_its_mail_until_purged(shell: Shell) -> None:
    ann, ben = shell.agent("ann"), shell.agent("ben")
    read = shell.send(ann, "ben", "read and acknowledged")
    ok_sync(shell.serve.url, ben, "FetchAgentInbox", {"limit": 1})
    ok_sync(shell.serve.url, ben, "AcknowledgeAgentInbox", {"ids": [read]})
    sent = [shell.send(ann, "ben", f"note {n}") for n in range(2)]
    said = shell.run("agents", "retire", "ben")
    assert said.startswith("retired ben: sends to it get unknown_recipient") and "(2 envelopes)" in said
    assert shell.refused(ann, "SendAgentMessage", {"to": "ben", "message": {"kind": 1, "text": "x"}}) == (
        "unknown_recipient"
    )
    for tool, arguments in (("FetchAgentInbox", {}), ("RegisterAgentAddress", REGISTER)):
        assert shell.refused(ben, tool, arguments) == "agent_retired"
    waited = httpx2.post(shell.serve.base + WAIT_PATH, json={"timeout_ms": 0}, headers=ben, timeout=10)
    assert (waited.status_code, waited.json()["error"]["code"]) == (410, "agent_retired")
    listed = json.loads(shell.run("agents", "--json"))
    assert "ben" not in [a["agent"] for a in listed["agents"]]
    assert shell.states(ann, sent) == ["queued", "queued"]
    kept = json.loads(shell.run("history", "--agent", "ben", "--json"))["entries"]
    assert [e["id"] for e in kept] == [read]  # readable to operators until the retention ends
    assert "2 envelopes" in shell.run("inbox", "purge", "ben")  # retired: its inbox stays purgeable
    again = json.loads(shell.run("agents", "retire", "ben", "--purge", "--json"))
    assert again == {"agent": "ben", "retired_now": False, "sessions": ["s-1"], "purged": 2}
    assert shell.states(ann, sent) == ["purged", "purged"]
    assert json.loads(shell.run("history", "--agent", "ben", "--json"))["entries"] == []


def test_inbox_purge_asks_for_yes_then_drops_and_records_purged(shell: Shell) -> None:
    cyd, dot = shell.agent("cyd"), shell.agent("dot")
    sent = [shell.send(cyd, "dot", f"note {n}") for n in range(3)]
    ok_sync(shell.serve.url, dot, "FetchAgentInbox", {"limit": 1})
    dry = shell.run("inbox", "purge", "dot")
    assert dry.startswith("would drop 3 envelopes queued for dot (1 handed out") and "--yes" in dry
    assert shell.states(cyd, sent) == ["delivered", "queued", "queued"]  # nothing changed
    assert json.loads(shell.run("inbox", "purge", "dot", "--yes", "--json")) == {"agent": "dot", "purged": 3}
    assert shell.states(cyd, sent) == ["purged"] * 3
    assert ok_sync(shell.serve.url, dot, "FetchAgentInbox", {})["envelopes"] == []
    assert shell.send(cyd, "dot", "after the purge")  # dot is still registered: mail flows again


def test_lifecycle_commands_refuse_what_they_cannot_do(shell: Shell) -> None:
    for args, said in (
        (["agents", "retire", "nobody"], "'nobody' is not registered"),
        (["inbox", "purge", "nobody", "--yes"], "'nobody' is not registered"),
    ):
        stderr = shell.run(*args, code=1)
        assert said in stderr and len(stderr.strip().splitlines()) == 1
    stderr = shell.run("agents", "retire", "Not An Id", code=2)
    assert "ID" in stderr and len(stderr.strip().splitlines()) == 1
    stderr = shell.run("inbox", "purge", code=2)
    assert "ID" in stderr


def test_a_session_that_left_is_gone_in_relay_agents_until_its_next_call(shell: Shell) -> None:
    eve = shell.agent("eve")

    def presence() -> tuple[str, str | None]:
        (found,) = [a for a in json.loads(shell.run("agents", "--json"))["agents"] if a["agent"] == "eve"]
        return found["presence"], found["last_seen"]

    assert presence()[0] == "live"  # it registered just now
    left = httpx2.post(shell.serve.base + LEAVE_PATH, content=b"{}", headers=eve, timeout=10)
    assert (left.status_code, left.json()) == (200, {"ended": True})
    assert presence()[0] == "gone"
    listed = ok_sync(shell.serve.url, shell.agent("fay"), "ListAgents", {})["agents"]
    assert {a["id"]: a["presence"] for a in listed}["eve"] == "gone"
    text = shell.run("agents")
    (eve_row,) = [line for line in text.splitlines() if line.startswith("eve ")]
    assert "PRESENCE" in text and " gone " in eve_row
    ok_sync(shell.serve.url, eve, "FetchAgentInbox", {})
    assert presence()[0] == "live"
    for body, status in ((b'{"x": 1}', 400), (b"[", 400)):
        refused = httpx2.post(shell.serve.base + LEAVE_PATH, content=body, headers=eve, timeout=10)
        assert refused.status_code == status and refused.json()["error"]["code"] == "invalid_argument"
    assert httpx2.get(shell.serve.base + LEAVE_PATH, headers=eve, timeout=10).status_code == 405
    stranger = httpx2.post(shell.serve.base + LEAVE_PATH, content=b"{}", timeout=10)
    assert stranger.status_code == 401
