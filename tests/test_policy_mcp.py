"""Contact policies through the real fronts: ``relay policy set|show`` (the CLI as a subprocess) on
the Redis of a real ``relay serve``, and sends over ``/mcp/agent`` with the official ``mcp`` client
(and a person's ``relay send``) that the policy accepts or refuses."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import KeyRing, agent_headers
from broker.limits import MAX_POLICY_AGENTS
from tests.front_support import data, error, key_file
from tests.processes import REGISTER, ServeProcess, run_relay, sample, serve_processes

KEYS = Keys()


@dataclass
class Worker:
    process: ServeProcess
    store: redis.Redis
    env: dict[str, str]
    keyring: KeyRing

    @contextlib.asynccontextmanager
    async def agent(self, name: str) -> AsyncIterator[Client]:
        """An MCP client of agent ``name``, registered."""
        headers = agent_headers(self.keyring, name, f"{name}-1")
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
        async with http, Client(streamable_http_client(self.process.url, http_client=http)) as client:
            data(await client.call_tool("RegisterAgentAddress", REGISTER))
            yield client

    def relay(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = run_relay(*args, env=self.env)
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def show(self, agent: str) -> dict[str, Any]:
        shown = self.relay("policy", "show", agent, "--json")
        assert shown.returncode == 0, shown
        found: dict[str, Any] = json.loads(shown.stdout)
        return found


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    tmp = tmp_path_factory.mktemp("policy")
    server = EmbeddedRedis()
    server.start()
    try:
        key = key_file(tmp)
        with serve_processes(tmp, 1, "--redis-url", server.url, "--agent-mcp-key-file", str(key)) as (
            process,
        ):
            store = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
            env = {"RELAY_URL": process.base, "RELAY_KEY_FILE": str(key), "RELAY_REDIS_URL": server.url}
            yield Worker(process, store, env, load_key_file(key))
            store.close()
    finally:
        server.stop()


async def send(client: Client, to: str, text: str) -> Any:
    return await client.call_tool("SendAgentMessage", {"to": to, "message": {"kind": 1, "text": text}})


async def test_a_list_set_with_the_cli_refuses_others_over_mcp_and_is_audited(worker: Worker) -> None:
    async with worker.agent("pol-boss") as boss, worker.agent("pol-peer") as peer, worker.agent("pol-x") as x:
        assert worker.show("pol-boss") == {"agent": "pol-boss", "accept_from": "open", "registered": True}
        changed = worker.relay("policy", "set", "pol-boss", "--accept-from", "pol-peer, ada")
        assert changed.returncode == 0, changed
        assert "pol-boss accepts messages from: list of 2: ada, pol-peer (was: open)" in changed.stdout
        (line,) = [json.loads(x) for x in changed.stderr.splitlines()]
        assert line["logger"] == "relay.policy" and line["event"] == "policy_changed"
        assert (line["agent"], line["old"], line["new"]) == (
            "pol-boss",
            {"accept_from": "open"},
            {"accept_from": "list", "agents": ["ada", "pol-peer"]},
        )
        before = sample(worker.process.metrics(), "csf_relay_sends_not_accepted_total", tier="host")
        refused = error(await send(x, "pol-boss", "let me in"))
        assert (refused["code"], refused["field"], refused["retryable"]) == ("not_accepted", "to", False)
        assert "relay policy set pol-boss --accept-from" in refused["message"]
        assert worker.store.xlen(KEYS.inbox("pol-boss")) == 0  # nothing stored
        accepted = data(await send(peer, "pol-boss", "hello"))
        envelopes = data(await boss.call_tool("FetchAgentInbox", {}))["envelopes"]
        assert [e["id"] for e in envelopes] == [accepted["id"]]
        after = sample(worker.process.metrics(), "csf_relay_sends_not_accepted_total", tier="host")
        assert after == before + 1
        assert sample(worker.process.metrics(), "csf_relay_refusals_total", code="not_accepted") >= 1

        reopened = worker.relay("policy", "set", "pol-boss", "--accept-from", "open", "--json")
        assert json.loads(reopened.stdout)["old"] == {"accept_from": "list", "agents": ["ada", "pol-peer"]}
        data(await send(x, "pol-boss", "now open"))


async def test_people_follow_the_policy_through_relay_send(worker: Worker) -> None:
    async with worker.agent("pol-desk"):
        assert worker.relay("policy", "set", "pol-desk", "--accept-from", "registered").returncode == 0
        sent = worker.relay("send", "--from", "grace", "--to", "pol-desk", "people are registered")
        assert sent.returncode == 0, sent
        assert worker.relay("policy", "set", "pol-desk", "--accept-from", "pol-peer").returncode == 0
        refused = worker.relay("send", "--from", "grace", "--to", "pol-desk", "not listed")
        assert refused.returncode == 1
        assert "relay refused the send (not_accepted)" in refused.stderr
        assert worker.store.xlen(KEYS.inbox("pol-desk")) == 1
        first = worker.relay("send", "--from", "hopper", "--to", "pol-desk", "a first send, refused")
        assert first.returncode == 1 and "(not_accepted)" in first.stderr
        assert "hopper was not registered" in first.stderr
        assert not worker.store.exists(KEYS.registration("hopper"))  # a refused first send registers nobody
        assert worker.relay("policy", "set", "pol-desk", "--accept-from", "pol-peer,grace").returncode == 0
        assert worker.relay("send", "--from", "grace", "--to", "pol-desk", "listed").returncode == 0
        assert worker.store.xlen(KEYS.inbox("pol-desk")) == 2


async def test_hostile_lists_are_refused_precisely_and_change_nothing(worker: Worker) -> None:
    assert worker.relay("policy", "set", "pol-guard", "--accept-from", "pol-peer").returncode == 0
    many = ",".join(f"agent-{i}" for i in range(10_000))
    refused = worker.relay("policy", "set", "pol-guard", "--accept-from", many)
    assert refused.returncode == 2
    assert "--accept-from" in refused.stderr and f"at most {MAX_POLICY_AGENTS} agent ids" in refused.stderr
    assert "nothing was changed" in refused.stderr
    bad = worker.relay("policy", "set", "pol-guard", "--accept-from", "pol-peer,Bad Id")
    assert bad.returncode == 2
    assert "--accept-from[1]: 'Bad Id' is not a valid agent id" in bad.stderr
    wrong = worker.relay("policy", "set", "Pol Guard", "--accept-from", "open")
    assert wrong.returncode == 2 and "ID: 'Pol Guard' is not a valid agent id" in wrong.stderr
    assert worker.show("pol-guard") == {
        "agent": "pol-guard",
        "accept_from": "list",
        "agents": ["pol-peer"],
        "registered": False,
    }
    at_cap = ",".join(f"agent-{i}" for i in range(MAX_POLICY_AGENTS))
    assert worker.relay("policy", "set", "pol-guard", "--accept-from", at_cap).returncode == 0
    assert len(worker.show("pol-guard")["agents"]) == MAX_POLICY_AGENTS


def test_redis_trouble_is_one_clear_retryable_line() -> None:
    for command in ("set", "show"):
        extra = ["--accept-from", "open"] if command == "set" else []
        result = run_relay("policy", command, "bob", *extra, "--redis-url", "redis://127.0.0.1:1/0")
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr and "retry" in result.stderr
