"""relay on a real Redis Cluster (3 masters, 3 replicas, started by the test run): two ``relay serve``
workers pointed at different nodes serve the same agents over MCP, ``relay inspect`` and ``relay
dead-letters`` read the cluster, and docs/operations.md's ``redis-cli -c`` recipes run as written.

The workers use the default key prefix ``relay``; every other cluster test uses a random prefix."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import redis

from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import KeyRing, agent_headers
from tests.cluster_support import LocalCluster, find_cli
from tests.front_support import key_file
from tests.processes import REGISTER, ROOT, ServeProcess, ok, run_relay

KEYS = Keys()


@dataclass
class Workers:
    cluster: LocalCluster
    keyring: KeyRing
    a: ServeProcess
    b: ServeProcess

    def headers(self, agent: str, session: str) -> dict[str, str]:
        return agent_headers(self.keyring, agent, session)


@pytest.fixture(scope="module")
def workers(redis_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    tmp = tmp_path_factory.mktemp("cluster")
    key = key_file(tmp)
    first, second = redis_cluster.urls[0], redis_cluster.urls[1]
    a = ServeProcess(["--redis-url", first, "--agent-mcp-key-file", str(key)], tmp / "a.log")
    b = ServeProcess(["--redis-url", second, "--agent-mcp-key-file", str(key)], tmp / "b.log")
    try:
        a.start()
        b.start()
        yield Workers(redis_cluster, load_key_file(key), a, b)
        for worker in (a, b):
            assert worker.stop() == 0, worker.log.read_text()
    finally:
        a.kill()
        b.kill()


def note(to: str, text: str) -> dict[str, object]:
    return {"to": to, "message": {"kind": 1, "text": text}}


async def test_two_workers_on_different_nodes_serve_the_same_agents(workers: Workers) -> None:
    a, b = workers.a, workers.b
    alice, bob = workers.headers("alice", "alice-1"), workers.headers("bob", "bob-1")
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        for headers in (alice, bob):
            await ok(http, a.url, headers, "RegisterAgentAddress", REGISTER)
        sent = [
            (
                await ok(
                    http, b.url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 2, "text": t}}
                )
            )["id"]
            for t in ("one", "two")
        ]
        got = (await ok(http, a.url, bob, "FetchAgentInbox", {}))["envelopes"]
        assert [e["id"] for e in got] == sent
        assert (await ok(http, b.url, bob, "AcknowledgeAgentInbox", {"ids": sent}))["acknowledged"] == sent

        poll = asyncio.create_task(ok(http, a.url, bob, "FetchAgentInbox", {"wait_ms": 20000}))
        late = await ok(
            http, b.url, alice, "SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "w"}}
        )
        assert [e["id"] for e in (await asyncio.wait_for(poll, 15))["envelopes"]] == [late["id"]]
        await ok(http, a.url, bob, "AcknowledgeAgentInbox", {"ids": [late["id"]]})
        for worker in (a, b):
            assert (await http.get(f"{worker.base}/readyz")).status_code == 200


async def test_inspect_and_dead_letters_read_the_cluster(workers: Workers) -> None:
    url = workers.cluster.urls[2]
    async with httpx2.AsyncClient(timeout=30) as http:
        for agent in ("carol", "dave"):
            await ok(
                http, workers.a.url, workers.headers(agent, f"{agent}-1"), "RegisterAgentAddress", REGISTER
            )
        await ok(
            http,
            workers.a.url,
            workers.headers("carol", "carol-1"),
            "SendAgentMessage",
            {"to": "dave", "message": {"kind": 1, "text": "to be dead-lettered"}},
        )
    connection = RedisConnection(RedisSettings(url=url))
    queue = RedisDeliveryQueue(connection)
    await queue.open()
    try:
        (claimed,) = await queue.claim("dave", "dave@loop", 1, visibility=30)
        assert await queue.dead_letter("dave", claimed.envelope_id, "test")
    finally:
        await queue.close()

    found = run_relay("inspect", "--redis-url", url, "--json")
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout)
    agents = {a["agent"]: a for a in report["agents"]}
    assert {"alice", "bob", "carol", "dave"} <= set(agents)
    assert report["agents_registered"] == len(agents)
    assert agents["dave"]["dead_letters"] == 1 and agents["dave"]["inbox_depth"] == 0

    listed = run_relay("dead-letters", "list", "dave", "--redis-url", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert "to be dead-lettered" in listed.stdout
    requeued = run_relay("dead-letters", "requeue", "dave", "--redis-url", url)
    assert requeued.returncode == 0, requeued.stderr
    after = json.loads(run_relay("inspect", "dave", "--redis-url", url, "--json").stdout)
    assert after["agents"][0]["dead_letters"] == 0 and after["agents"][0]["inbox_depth"] == 1


def recipes() -> list[str]:
    """The redis-cli lines of docs/operations.md's recipe block."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("## redis-cli recipes", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.startswith("redis-cli")]


@pytest.mark.skipif(find_cli() is None, reason="redis-cli is not installed (apt-get install redis-tools)")
def test_the_operations_recipes_run_on_the_cluster(workers: Workers) -> None:
    cli = find_cli()
    assert cli is not None
    lines = recipes()
    assert len(lines) >= 10 and all(line.startswith("redis-cli -c ") for line in lines), lines
    port = str(workers.cluster.nodes[0].port)
    outputs = {}
    for line in lines:
        args = _split(line)
        ran = subprocess.run(
            [cli, "-p", port, *args[1:]], capture_output=True, text=True, timeout=30, check=False
        )
        assert ran.returncode == 0 and not ran.stdout.startswith(("(error)", "ERR", "MOVED")), (line, ran)
        outputs[line] = ran.stdout
    assert "claudecode" in outputs["redis-cli -c HGETALL 'relay:agent:{bob}'"]
    # the directory: --scan on each master, together, finds every registration
    masters = [n for n in workers.cluster.nodes if n.running and _is_master(n.port)]
    scanned: set[str] = set()
    for node in masters:
        ran = subprocess.run(
            [cli, "-c", "-p", str(node.port), "--scan", "--pattern", "relay:agent:{*}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        scanned |= set(ran.stdout.split())
    assert {"relay:agent:{alice}", "relay:agent:{bob}"} <= scanned


def _is_master(port: int) -> bool:
    with redis.Redis(port=port, decode_responses=True, socket_timeout=5) as client:
        return client.info("replication")["role"] == "master"


def _split(line: str) -> list[str]:
    return [part.strip("'") for part in re.findall(r"'[^']*'|\S+", line)]


def test_migrate_on_a_cluster_finds_nothing_to_do(workers: Workers, tmp_path: Path) -> None:
    result = run_relay("migrate", "--redis-url", workers.cluster.url)
    assert result.returncode == 0 and result.stdout.startswith("nothing to migrate"), result
