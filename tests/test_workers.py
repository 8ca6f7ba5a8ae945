"""Several ``relay serve`` workers on one Redis: any worker serves any agent, long polls are woken by
sends on other workers, each worker's /metrics counts what it did, and a full inbox is refused over
MCP with a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from adapters.redis.keys import Keys
from adapters.redis.server import EmbeddedRedis
from broker.front.auth import KeyRing, agent_headers, load_key_file
from tests.front_support import free_port, key_file
from tests.test_compose import dockerfile

ROOT = Path(__file__).resolve().parents[1]
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
INBOX_CAP = 3
KEYS = Keys()


@dataclass
class Worker:
    """One ``relay serve`` child process on a free loopback port; output goes to ``log``."""

    args: list[str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp(self) -> str:
        return f"{self.base}/mcp/agent"

    def start(self, timeout: float = 30.0) -> Worker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "serve", "--port", str(self.port), *self.args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"relay serve exited: {self.log.read_text()}")
            try:
                if httpx2.get(f"{self.base}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"relay serve did not become ready: {self.log.read_text()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample on /metrics, keyed by (name, sorted labels)."""
        text = httpx2.get(f"{self.base}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


async def call(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """One tools/call as plain JSON-RPC; returns the tool result (``isError`` and all)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    response = await http.post(
        url,
        json=body,
        headers={
            **headers,
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-11-25",
        },
    )
    assert response.status_code == 200, response.text
    return dict(response.json()["result"])


async def ok(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    result = await call(http, url, headers, name, arguments)
    assert not result.get("isError"), result
    return dict(result["structuredContent"])


def wait_until_blocked(client: redis.Redis, timeout: float = 10.0) -> None:
    """Poll Redis until a client is blocked (an XREADGROUP ... BLOCK of a long poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(client.info("clients")["blocked_clients"]) >= 1:
            return
        time.sleep(0.01)
    raise AssertionError("no long poll blocked in Redis")


@dataclass
class Cluster:
    server: EmbeddedRedis
    client: redis.Redis
    keyring: KeyRing
    a: Worker
    b: Worker

    def headers(self, agent: str, session: str) -> dict[str, str]:
        return agent_headers(self.keyring, agent, session)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("workers")
    server = EmbeddedRedis()
    server.start()
    workers: list[Worker] = []
    try:
        key = key_file(tmp)
        args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key), "--inbox-cap", str(INBOX_CAP)]
        for name in ("a", "b"):
            workers.append(Worker(args, tmp / f"worker-{name}.log").start())
        client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
        yield Cluster(server, client, load_key_file(key), workers[0], workers[1])
        client.close()
        for worker in workers:
            assert worker.stop() == 0, worker.log.read_text()
    finally:
        for worker in workers:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(5)
        server.stop()


async def test_two_workers_serve_the_same_agents_and_count_what_each_did(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    alice, bob = cluster.headers("alice", "alice-1"), cluster.headers("bob", "bob-1")
    before = {"a": a.metrics(), "b": b.metrics()}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        await ok(http, a.mcp, alice, "RegisterAgentAddress", REGISTER)
        await ok(http, a.mcp, bob, "RegisterAgentAddress", REGISTER)
        sent = [
            (
                await ok(
                    http, b.mcp, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": t}}
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

        got = (await ok(http, a.mcp, bob, "FetchAgentInbox", {"limit": 16}))["envelopes"]
        assert [e["id"] for e in got] == sent
        assert [e["from"] for e in got] == ["alice"] * 3 and all(e["deliveries"] == 1 for e in got)
        assert sample(b.metrics(), "csf_relay_inbox_pending", agent="bob") == 3
        done = await ok(http, b.mcp, bob, "AcknowledgeAgentInbox", {"ids": sent})
        assert done == {"acknowledged": sent, "unknown": []}
        assert (await ok(http, a.mcp, bob, "FetchAgentInbox", {}))["envelopes"] == []
        assert cluster.client.xlen(KEYS.inbox("bob")) == 0

        # a long poll on A is woken by a send on B
        started = time.monotonic()
        poll = asyncio.create_task(ok(http, a.mcp, bob, "FetchAgentInbox", {"wait_ms": 20000}))
        await asyncio.to_thread(wait_until_blocked, cluster.client)
        late = await ok(
            http, b.mcp, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "wake"}}
        )
        woken = (await asyncio.wait_for(poll, 15))["envelopes"]
        assert [e["id"] for e in woken] == [late["id"]]
        assert time.monotonic() - started < 15
        await ok(http, a.mcp, bob, "AcknowledgeAgentInbox", {"ids": [late["id"]]})

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
        await ok(http, a.mcp, carol, "RegisterAgentAddress", REGISTER)
        await ok(http, b.mcp, dave, "RegisterAgentAddress", REGISTER)
        for i in range(INBOX_CAP):
            worker = (a, b)[i % 2]
            await ok(
                http,
                worker.mcp,
                carol,
                "SendAgentMessage",
                {"to": "dave", "message": {"kind": 1, "text": f"{i}"}},
            )
        full = await call(
            http, b.mcp, carol, "SendAgentMessage", {"to": "dave", "message": {"kind": 1, "text": "x"}}
        )
        assert full["isError"] is True
        error = json.loads(full["content"][0]["text"])["error"]
        assert error["code"] == "inbox_full" and error["retryable"] is True
        assert "'dave'" in error["message"] and f"({INBOX_CAP} unacknowledged" in error["message"]
        assert cluster.client.xlen(KEYS.inbox("dave")) == INBOX_CAP
        assert sample(b.metrics(), "csf_relay_refusals_total", code="inbox_full") == refused_before + 1

        first = (await ok(http, a.mcp, dave, "FetchAgentInbox", {"limit": 1}))["envelopes"][0]["id"]
        await ok(http, a.mcp, dave, "AcknowledgeAgentInbox", {"ids": [first]})
        await ok(
            http, b.mcp, carol, "SendAgentMessage", {"to": "dave", "message": {"kind": 1, "text": "fits"}}
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
