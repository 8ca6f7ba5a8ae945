"""Several ``relay serve`` workers on one Redis: any worker serves any agent, long polls are woken by
sends on other workers, each worker's /metrics counts what it did, and a full inbox is refused over
MCP with a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx2
import pytest
import redis

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import KeyRing, agent_headers
from broker.testing.polling import wait_until
from tests.front_support import free_port, key_file
from tests.processes import REGISTER, ServeProcess, call_tool, ok, sample, serve_processes
from tests.support import dockerfile

INBOX_CAP = 3
KEYS = Keys()


def wait_until_parked(worker: ServeProcess, timeout: float = 10.0) -> None:
    """Poll the worker's /metrics until a long poll is parked there."""
    wait_until(
        lambda: sample(worker.metrics(), "csf_relay_long_polls_parked") >= 1,
        timeout,
        "a long poll parked on the worker",
    )


@dataclass
class Cluster:
    server: EmbeddedRedis
    client: redis.Redis
    keyring: KeyRing
    a: ServeProcess
    b: ServeProcess

    def headers(self, agent: str, session: str) -> dict[str, str]:
        return agent_headers(self.keyring, agent, session)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("workers")
    server = EmbeddedRedis()
    server.start()
    try:
        key = key_file(tmp)
        args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key), "--inbox-cap", str(INBOX_CAP)]
        with serve_processes(tmp, 2, *args) as (a, b):
            client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
            yield Cluster(server, client, load_key_file(key), a, b)
            client.close()
    finally:
        server.stop()


async def test_two_workers_serve_the_same_agents_and_count_what_each_did(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    alice, bob = cluster.headers("alice", "alice-1"), cluster.headers("bob", "bob-1")
    before = {"a": a.metrics(), "b": b.metrics()}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        await ok(http, a.url, alice, "RegisterAgentAddress", REGISTER)
        await ok(http, a.url, bob, "RegisterAgentAddress", REGISTER)
        sent = [
            (
                await ok(
                    http, b.url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": t}}
                )
            )["id"]
            for t in ("one", "two", "three")
        ]
        # both workers read the same Redis-wide inbox figures at scrape time
        for worker in (a, b):
            now = worker.metrics()
            assert sample(now, "csf_relay_inbox_depth", agent="bob") == 3
            assert sample(now, "csf_relay_inbox_pending", agent="bob") == 0
            assert sample(now, "csf_relay_registered_agents", tier="host") == 2

        got = (await ok(http, a.url, bob, "FetchAgentInbox", {"limit": 16}))["envelopes"]
        assert [e["id"] for e in got] == sent
        assert [e["from"] for e in got] == ["alice"] * 3 and all(e["deliveries"] == 1 for e in got)
        assert sample(b.metrics(), "csf_relay_inbox_pending", agent="bob") == 3
        done = await ok(http, b.url, bob, "AcknowledgeAgentInbox", {"ids": sent})
        assert done == {"acknowledged": sent, "unknown": []}
        assert (await ok(http, a.url, bob, "FetchAgentInbox", {}))["envelopes"] == []
        assert cluster.client.xlen(KEYS.inbox("bob")) == 0

        # a long poll on A is woken by a send on B
        poll = asyncio.create_task(ok(http, a.url, bob, "FetchAgentInbox", {"wait_ms": 20000}))
        await asyncio.to_thread(wait_until_parked, a)
        late = await ok(
            http, b.url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "wake"}}
        )
        woken = (await asyncio.wait_for(poll, 60))["envelopes"]
        assert [e["id"] for e in woken] == [late["id"]]  # woken: a poll that runs out answers none
        await ok(http, a.url, bob, "AcknowledgeAgentInbox", {"ids": [late["id"]]})

    after = {"a": a.metrics(), "b": b.metrics()}

    def did(worker: str, name: str, **labels: str) -> float:
        return sample(after[worker], name, **labels) - sample(before[worker], name, **labels)

    sent_total, delivered_total = "csf_relay_envelopes_sent_total", "csf_relay_envelopes_delivered_total"
    acked_total = "csf_relay_envelopes_acknowledged_total"
    assert (did("a", sent_total, tier="host"), did("b", sent_total, tier="host")) == (0, 4)
    assert (did("a", delivered_total, tier="host"), did("b", delivered_total, tier="host")) == (4, 0)
    assert (did("a", acked_total), did("b", acked_total)) == (1, 3)
    assert did("a", sent_total, tier="host") + did("b", sent_total, tier="host") == 4
    assert did("a", delivered_total, tier="host") + did("b", delivered_total, tier="host") == 4
    assert did("a", acked_total) + did("b", acked_total) == 4
    for name in ("a", "b"):
        assert sample(after[name], "csf_relay_inbox_depth", agent="bob") == 0
        assert sample(after[name], "csf_relay_inbox_oldest_unacked_seconds", agent="bob") == 0
        assert sample(after[name], "csf_relay_inspection_up") == 1


async def test_a_full_inbox_is_refused_over_mcp_naming_recipient_and_cap(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    carol, dave = cluster.headers("carol", "carol-1"), cluster.headers("dave", "dave-1")
    refused_before = sample(b.metrics(), "csf_relay_refusals_total", code="inbox_full")
    async with httpx2.AsyncClient(timeout=30) as http:
        await ok(http, a.url, carol, "RegisterAgentAddress", REGISTER)
        await ok(http, b.url, dave, "RegisterAgentAddress", REGISTER)
        for i in range(INBOX_CAP):
            worker = (a, b)[i % 2]
            await ok(
                http,
                worker.url,
                carol,
                "SendAgentMessage",
                {"to": "dave", "message": {"kind": 1, "text": f"{i}"}},
            )
        full = await call_tool(
            http, b.url, carol, "SendAgentMessage", {"to": "dave", "message": {"kind": 1, "text": "x"}}
        )
        assert full["isError"] is True
        error = json.loads(full["content"][0]["text"])["error"]
        assert error["code"] == "inbox_full" and error["retryable"] is True
        assert "'dave'" in error["message"] and f"cap in force is {INBOX_CAP}" in error["message"]
        assert cluster.client.xlen(KEYS.inbox("dave")) == INBOX_CAP
        assert sample(b.metrics(), "csf_relay_refusals_total", code="inbox_full") == refused_before + 1

        first = (await ok(http, a.url, dave, "FetchAgentInbox", {"limit": 1}))["envelopes"][0]["id"]
        await ok(http, a.url, dave, "AcknowledgeAgentInbox", {"ids": [first]})
        await ok(
            http, b.url, carol, "SendAgentMessage", {"to": "dave", "message": {"kind": 1, "text": "fits"}}
        )
        assert cluster.client.xlen(KEYS.inbox("dave")) == INBOX_CAP


def test_the_image_healthcheck_passes_against_a_running_worker(cluster: Cluster) -> None:
    (healthcheck,) = [rest for instruction, rest in dockerfile() if instruction == "HEALTHCHECK"]
    command = json.loads(healthcheck.partition("CMD ")[2])
    assert command[0] == "python"

    def probe(port: int) -> int:
        env = {**os.environ, "RELAY_PORT": str(port)}
        return subprocess.run(
            [sys.executable, *command[1:]], env=env, capture_output=True, timeout=30
        ).returncode

    assert probe(cluster.a.port) == 0
    assert probe(free_port()) != 0
