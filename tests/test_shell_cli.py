"""The shell commands (``relay agents``, ``send``, ``read``, ``tail``, ``thread``) as child processes,
against a real ``relay serve`` and a Redis started for this module; agents act over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from adapters.redis.embedded import EmbeddedRedis
from broker.addresses import HUMAN_SESSION
from broker.testing.polling import wait_until
from relay.entry import EXIT_READER_GONE
from tests.front_support import error, key_file
from tests.processes import REGISTER, ROOT, ServeProcess, ok_sync, run_relay

HOSTILE = "\x1b[2J\x1b[31mred\x1b]0;pwned\x07 back\rspace\u202eevil\u200b\nsecond line"


class Relay:
    """A running relay and what a shell command needs to reach it."""

    def __init__(self, serve: ServeProcess, redis_url: str, key: Path) -> None:
        self.serve = serve
        self.key = key
        self.env = {"RELAY_URL": serve.base, "RELAY_KEY_FILE": str(key), "RELAY_REDIS_URL": redis_url}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        if stdin is None:
            return run_relay(*args, env=self.env)
        return subprocess.run(
            [sys.executable, "-m", "relay", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, result
        assert "Traceback" not in result.stderr
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def agent(self, name: str, session: str = "s-1") -> dict[str, str]:
        """Register ``name`` as a Claude Code agent over MCP; its headers."""
        from broker.front.key_file import load_key_file
        from broker.front.tokens import agent_headers

        headers = agent_headers(load_key_file(self.key), name, session)
        ok_sync(self.serve.url, headers, "RegisterAgentAddress", REGISTER)
        return headers


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    tmp = tmp_path_factory.mktemp("shell")
    redis = EmbeddedRedis()
    redis.start()
    key = key_file(tmp)
    serve = ServeProcess(["--redis-url", redis.url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
    try:
        serve.start()
        yield Relay(serve, redis.url, key)
    finally:
        serve.kill()
        redis.stop()


def test_send_registers_a_person_and_agents_lists_everyone(relay: Relay) -> None:
    bob = relay.agent("bob")
    sent = relay.run("send", "--from", "ada", "--to", "bob", "hello bob")
    assert sent.returncode == 0, sent
    envelope_id = sent.stdout.strip()
    assert envelope_id.startswith("env_") and len(envelope_id) == 30
    assert "registered ada as a person" in sent.stderr
    again = relay.run("send", "--from", "ada", "--to", "bob", "--kind", "request", "second")
    assert again.returncode == 0 and "registered" not in again.stderr  # ada is known now

    listing = relay.json("agents")
    agents = {a["agent"]: a for a in listing["agents"]}
    assert agents["ada"]["provider"] == "human" and agents["ada"]["tier"] == "host"
    assert agents["ada"]["session"] == "shell" and agents["ada"]["last_seen"] is not None
    bob_figures = agents["bob"]
    assert (bob_figures["inbox_depth"], bob_figures["pending"], bob_figures["dead_letters"]) == (2, 0, 0)
    assert agents["bob"]["oldest_unacked_seconds"] >= 0 and agents["bob"]["provider"] == "claudecode"

    table = relay.ok("agents").splitlines()
    header = table[0]
    for column in ("AGENT", "PROVIDER", "TIER", "SESSION", "INBOX", "PENDING", "OLDEST", "DEAD", "LAST SEEN"):
        assert column in header
    bob_row = next(line for line in table if line.startswith("bob "))
    assert bob_row.index("claudecode") == header.index("PROVIDER")  # aligned under its heading
    assert " ago " in bob_row and "Z" in bob_row  # relative and absolute

    # agents answer the person over MCP like any agent
    fetched = ok_sync(relay.serve.url, bob, "FetchAgentInbox", {})
    assert [e["from"] for e in fetched["envelopes"]] == ["ada", "ada"]
    reply = {"kind": "reply", "text": "hi ada", "in_reply_to": envelope_id}
    ok_sync(relay.serve.url, bob, "SendAgentMessage", {"to": "ada", "message": reply})
    assert [e["message"]["text"] for e in relay.json("read", "--agent", "ada")["envelopes"]] == ["hi ada"]


def test_send_gets_every_check_an_agent_gets(relay: Relay) -> None:
    relay.agent("carl")
    unknown = relay.run("send", "--from", "ada", "--to", "nobody", "hi")
    assert unknown.returncode == 1 and "unknown_recipient" in unknown.stderr
    contract = relay.run("send", "--from", "ada", "--to", "carl", "--kind", "reply", "no in_reply_to")
    assert contract.returncode == 1 and "contract_violation" in contract.stderr
    taken = relay.run("send", "--from", "carl", "--to", "carl", "as an agent's id")
    assert taken.returncode == 1 and "carl is an agent's id" in taken.stderr
    bad_kind = relay.run("send", "--from", "ada", "--to", "carl", "--kind", "shout", "x")
    assert bad_kind.returncode == 2 and "note, request, reply, status" in bad_kind.stderr
    bad_id = relay.run("send", "--from", "Not An Id", "--to", "carl", "x")
    assert bad_id.returncode == 2 and "--from" in bad_id.stderr
    down = run_relay(
        "send", "--from", "ada", "--to", "carl", "x", env={**relay.env, "RELAY_URL": "http://127.0.0.1:1"}
    )
    assert down.returncode == 1 and "cannot reach relay at http://127.0.0.1:1" in down.stderr
    assert relay.json("read", "--agent", "carl")["envelopes"] == []  # nothing refused was stored
    for result in (unknown, contract, taken, bad_kind, bad_id, down):
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_send_reads_standard_input_and_the_key_from_the_data_dir(relay: Relay, tmp_path: Path) -> None:
    relay.agent("dora")
    (tmp_path / "relay.key").write_text(relay.key.read_text())
    (tmp_path / "relay.key").chmod(0o600)
    env = {k: v for k, v in relay.env.items() if k != "RELAY_KEY_FILE"}
    result = subprocess.run(
        [sys.executable, "-m", "relay", "send", "--from", "ada", "--to", "dora", "--data-dir", str(tmp_path)],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}, **env},
        input="from stdin\nline two\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result
    got = relay.json("read", "--agent", "dora")["envelopes"]
    assert [e["message"]["text"] for e in got] == ["from stdin\nline two"]


def test_read_is_read_only_until_ack(relay: Relay) -> None:
    relay.agent("erin")
    ids = [relay.ok("send", "--from", "ada", "--to", "erin", f"note {n}").strip() for n in range(3)]
    for _ in range(2):
        shown = relay.json("read", "--agent", "erin")
        assert [e["id"] for e in shown["envelopes"]] == ids
        assert all(e["deliveries"] == 0 for e in shown["envelopes"])
    text = relay.ok("read", "--agent", "erin")
    assert text.startswith("3 envelopes for erin, oldest first")
    assert "| note 0" in text and "ada -> erin" in text and " ago (" in text
    acked = relay.json("read", "--agent", "erin", "--ack")
    assert acked["acknowledged"] == ids and [e["id"] for e in acked["envelopes"]] == ids
    assert relay.json("read", "--agent", "erin")["envelopes"] == []
    assert (
        relay.ok("read", "--agent", "erin", "--wait", "1").strip() == "no unacknowledged envelopes for erin"
    )


def test_thread_follows_in_reply_to(relay: Relay) -> None:
    frank = relay.agent("frank")
    ask = relay.ok("send", "--from", "gail", "--to", "frank", "--kind", "request", "build it?").strip()
    answer = ok_sync(
        relay.serve.url,
        frank,
        "SendAgentMessage",
        {"to": "gail", "message": {"kind": "reply", "text": "done", "in_reply_to": ask}},
    )["id"]
    thanks = relay.ok("send", "--from", "gail", "--to", "frank", "--reply-to", answer, "thanks").strip()
    relay.ok("send", "--from", "gail", "--to", "frank", "unrelated")
    for start in (ask, answer, thanks):
        assert [e["id"] for e in relay.json("thread", start)["envelopes"]] == [ask, answer, thanks]
    text = relay.ok("thread", answer)
    assert f"\n*     {answer}" in text and f"\n  {ask}" in text and f"\n          {thanks}" in text
    assert f"in reply to: {ask}" in text
    missing = relay.run("thread", "env_00000000000000000000000000")
    assert missing.returncode == 1 and "in any inbox or history" in missing.stdout
    bad = relay.run("thread", "nope")
    assert bad.returncode == 2 and "not an envelope id" in bad.stderr


def test_tail_follows_new_envelopes_without_consuming_them(relay: Relay, tmp_path: Path) -> None:
    relay.agent("hana")
    relay.agent("ivan")
    before = relay.ok("send", "--from", "ada", "--to", "hana", "before tail").strip()
    out = (tmp_path / "tail.out").open("w+")
    err = (tmp_path / "tail.err").open("w+")
    tail = subprocess.Popen(
        [sys.executable, "-m", "relay", "tail", "hana", "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **relay.env},
        stdout=out,
        stderr=err,
    )
    sent: list[str] = []
    try:
        wait_until(lambda: "following" in (tmp_path / "tail.err").read_text(), 30, "tail started")

        def shown() -> list[str]:
            return [json.loads(line)["id"] for line in (tmp_path / "tail.out").read_text().splitlines()]

        def one_shown() -> bool:  # the subscription may be a moment behind the banner: send until seen
            relay.ok("send", "--from", "ada", "--to", "ivan", "not hana's")
            sent.append(relay.ok("send", "--from", "ada", "--to", "hana", "live").strip())
            return bool(shown())

        wait_until(one_shown, 60, "tail printed an envelope", interval=0.2)
        tail.send_signal(signal.SIGINT)
        assert tail.wait(30) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait(10)
        out.close()
        err.close()
    printed = shown()
    assert printed and set(printed) <= set(sent) and before not in printed
    assert "Traceback" not in (tmp_path / "tail.err").read_text()
    inbox = relay.json("read", "--agent", "hana")["envelopes"]
    assert all(e["deliveries"] == 0 for e in inbox)  # nothing was fetched or counted
    assert {before, *printed} <= {e["id"] for e in inbox}


def test_agent_supplied_text_is_escaped_everywhere(relay: Relay) -> None:
    relay.agent("jude")
    envelope_id = relay.ok(
        "send", "--from", "ada", "--to", "jude", "--reference", "x\x1b[1mref", HOSTILE
    ).strip()
    for output in (relay.ok("read", "--agent", "jude"), relay.ok("thread", envelope_id)):
        assert "\x1b" not in output and "\x07" not in output and "\r" not in output
        assert "\u202e" not in output and "\u200b" not in output
        assert "\\x1b[2J\\x1b[31mred\\x1b]0;pwned\\x07 back\\rspace\\u202eevil\\u200b" in output
        assert "| second line" in output and "reference: x\\x1b[1mref" in output
    as_json = relay.json("read", "--agent", "jude")["envelopes"][0]["message"]
    assert as_json["text"] == HOSTILE  # --json carries the exact text (JSON-escaped)


def test_shell_commands_need_redis_and_say_so(relay: Relay) -> None:
    for command in (
        ["agents"],
        ["read", "--agent", "ada"],
        ["tail"],
        ["thread", "env_00000000000000000000000000"],
    ):
        result = run_relay(*command)
        assert result.returncode == 2 and "RELAY_REDIS_URL" in result.stderr, result
    down = run_relay("agents", "--redis-url", "redis://127.0.0.1:1/0")
    assert down.returncode == 1 and "cannot read Redis at redis://127.0.0.1:1/0" in down.stderr


def test_send_never_speaks_for_an_agent(relay: Relay) -> None:
    relay.agent("lars")
    relay.agent("kira", session=HUMAN_SESSION)  # an agent whose session has the people's session name
    refused = relay.run("send", "--from", "kira", "--to", "lars", "as kira")
    assert refused.returncode == 1, refused
    assert "kira is an agent's id (provider claudecode)" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert relay.json("read", "--agent", "lars")["envelopes"] == []


async def test_an_agent_cannot_register_as_a_person(relay: Relay) -> None:
    from broker.front.key_file import load_key_file
    from broker.front.tokens import agent_headers

    headers = agent_headers(load_key_file(relay.key), "mimi", HUMAN_SESSION)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(relay.serve.url, http_client=http)) as mimi,
    ):
        refused = error(
            await mimi.call_tool("RegisterAgentAddress", {"provider": "human", "endpoint": "mimi"})
        )
    assert refused["code"] == "invalid_address"
    (violation,) = refused["violations"]
    assert violation["field"] == "provider" and violation["rule"] == "provider.person"
    assert "`relay send` and the dashboard" in violation["message"] and "'claudecode'" in violation["message"]
    assert "mimi" not in {a["agent"] for a in relay.json("agents")["agents"]}


def test_a_send_that_cannot_be_sent_registers_nobody(relay: Relay) -> None:
    relay.agent("nils")
    nobody = relay.run("send", "--from", "newbie", "--to", "nobody", "hi")
    assert nobody.returncode == 1 and "unknown_recipient" in nobody.stderr, nobody
    assert "recipient 'nobody' is not registered" in nobody.stderr
    bad = relay.run("send", "--from", "newbie", "--to", "nils", "--kind", "reply", "no in_reply_to")
    assert bad.returncode == 1 and "contract_violation" in bad.stderr, bad
    for result in (nobody, bad):
        assert "registered newbie" not in result.stderr and "Traceback" not in result.stderr
    assert "newbie" not in {a["agent"] for a in relay.json("agents")["agents"]}


def test_read_and_tail_of_an_agent_that_is_not_registered_say_so(relay: Relay) -> None:
    for command in (
        ["read", "--agent", "nobody"],
        ["read", "--agent", "nobody", "--ack"],
        ["tail", "nobody"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "relay", *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **relay.env},
            capture_output=True,
            text=True,
            timeout=30,  # a tail that follows silently runs into it
            check=False,
        )
        assert result.returncode == 1 and result.stdout == "", (command, result)
        assert "relay: error: agent 'nobody' is not registered at redis://" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_send_takes_a_ttl_and_an_idempotency_key_like_the_tool(relay: Relay) -> None:
    otto = relay.agent("otto")
    args = ["send", "--from", "ada", "--to", "otto", "--ttl", "600", "--idempotency-key", "deploy-v2:1"]
    first = relay.ok(*args, "ship it").strip()
    again = relay.ok(*args, "ship it").strip()
    assert again == first  # the retry stored nothing and answers with the first id
    (envelope,) = ok_sync(relay.serve.url, otto, "FetchAgentInbox", {})["envelopes"]
    assert envelope["id"] == first and "expires_at" in envelope
    conflict = relay.run(*args, "another message")
    assert conflict.returncode == 1 and "idempotency_conflict" in conflict.stderr, conflict
    for flag, value, says in (
        ("--ttl", "0", "outside 1..2592000 seconds"),
        ("--ttl", "2592001", "outside 1..2592000 seconds"),
        ("--idempotency-key", "two words", "is not a valid idempotency key"),
        ("--idempotency-key", "k" * 129, "is not a valid idempotency key"),
    ):
        bad = relay.run("send", "--from", "ada", "--to", "otto", flag, value, "x")
        assert bad.returncode == 2 and flag in bad.stderr and says in bad.stderr, bad
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert len(relay.json("read", "--agent", "otto")["envelopes"]) == 1


def test_no_traceback_when_the_reader_of_the_output_goes_away(relay: Relay) -> None:
    relay.agent("pia")
    envelope_id = relay.ok("send", "--from", "ada", "--to", "pia", "hello").strip()
    for command in (
        ["--help"],
        ["--version"],
        ["read", "--help"],
        ["hook", "--help"],
        ["agents"],
        ["read", "--agent", "pia"],
        ["thread", envelope_id],
    ):
        reader, writer = os.pipe()
        os.close(reader)  # the reader is gone before the command writes anything
        try:
            result = subprocess.run(
                [sys.executable, "-m", "relay", *command],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **relay.env},
                stdout=writer,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(writer)
        assert result.stderr == "", (command, result.stderr)
        # argparse's help and version writers ignore a closed output; everything else ends at the entry point
        assert result.returncode == (0 if command[-1].startswith("--") else EXIT_READER_GONE), command


def test_counts_are_singular_for_one(relay: Relay) -> None:
    relay.agent("quin")
    envelope_id = relay.ok("send", "--from", "ada", "--to", "quin", "the only one").strip()
    assert relay.ok("read", "--agent", "quin").startswith("1 envelope for quin, oldest first:")
    assert relay.ok("thread", envelope_id).startswith(f"thread of {envelope_id}: 1 stored envelope, oldest")
    acked = relay.ok("read", "--agent", "quin", "--ack")
    assert acked.rstrip().endswith("acknowledged 1 envelope")
