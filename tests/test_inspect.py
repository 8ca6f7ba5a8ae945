"""``relay inspect`` (run as ``python -m relay inspect``) and the inbox gauges on /metrics, on a Redis
started for this module with known contents."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import redis
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.gauges import InboxGauges
from adapters.redis.inspect import Inspector
from adapters.redis.keys import Keys
from broker import front
from broker.addresses import ClaudeCodeAddress, WorkbenchAddress
from broker.agent_message import AgentMessageContract
from broker.errors import BackendUnavailable
from broker.front.app import create_app
from broker.metrics import RelayMetrics
from broker.relay import Relay
from relay.commands.inspect import human_age
from tests.processes import ServeProcess, run_relay, sample
from tests.support import redis_relays, unique_prefix

KEYS = Keys()
OLD_SECONDS = 90


def one_error_line(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("relay: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


async def populate(url: str) -> None:
    """alice, bob, olga (host) and wendy (in-process): bob has 3 envelopes, 1 handed out, and 2 dead
    letters; olga has one envelope sent OLD_SECONDS ago (by the Redis clock)."""
    contract = AgentMessageContract()
    async with redis_relays(contract, url, 1, prefix=KEYS.prefix) as (relay,):
        host = ClaudeCodeAddress.parse("127.0.0.1:14111")
        for agent in ("alice", "bob", "olga"):
            await relay.register(agent, host, f"{agent}-1")
        await relay.register("wendy", WorkbenchAddress.parse("wb-wendy"), "wendy-1")
        for i in range(3):
            await relay.send("alice", "bob", contract.from_json({"kind": 1, "text": f"secret {i}"}))
        assert len(await relay.fetch("bob", 1)) == 1
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    with client:
        for i in range(2):
            client.xadd(KEYS.dead_letters("bob"), {"envelope_id": f"env_{i}", "reason": "test"})
        seconds, micros = client.time()
        old_ms = seconds * 1000 + micros // 1000 - OLD_SECONDS * 1000
        client.xadd(KEYS.inbox("olga"), {"from": "alice", "tier": "host", "text": "old"}, id=f"{old_ms}-0")


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[EmbeddedRedis]:
    embedded = EmbeddedRedis()
    embedded.start()
    try:
        await populate(embedded.url)
        yield embedded
    finally:
        embedded.stop()


def test_inspect_json_reports_every_agent_from_redis(server: EmbeddedRedis) -> None:
    result = run_relay("inspect", "--json", env={"RELAY_REDIS_URL": server.url})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["redis"] == server.url and report["agents_registered"] == 4
    agents = {a["agent"]: a for a in report["agents"]}
    assert list(agents) == ["alice", "bob", "olga", "wendy"]
    bob = agents["bob"]
    assert (bob["provider"], bob["endpoint"], bob["tier"], bob["session"]) == (
        "claudecode",
        "127.0.0.1:14111",
        "host",
        "bob-1",
    )
    assert (bob["inbox_depth"], bob["pending"], bob["not_yet_fetched"], bob["dead_letters"]) == (3, 1, 2, 2)
    assert 0 <= bob["age_seconds"] < 60 and 0 <= bob["oldest_unacked_seconds"] < 60
    assert agents["wendy"]["tier"] == "in_process" and agents["wendy"]["oldest_unacked_seconds"] is None
    olga = agents["olga"]
    assert olga["inbox_depth"] == 1 and olga["pending"] == 0
    assert OLD_SECONDS <= olga["oldest_unacked_seconds"] < OLD_SECONDS + 60
    assert "secret" not in result.stdout


def test_inspect_one_agent_prints_a_table(server: EmbeddedRedis) -> None:
    result = run_relay("inspect", "bob", "--redis-url", server.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "bob"
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[1:] if line.startswith("  ")}
    assert rows["provider"] == "claudecode" and rows["tier"] == "host" and rows["session"] == "bob-1"
    assert rows["inbox"] == "depth 3 unacknowledged (2 not yet fetched)"
    assert rows["pending"] == "1 handed out, not acknowledged"
    assert rows["dead"] == "letters 2"
    assert lines[-1].startswith(f"read from {server.url} at ")
    olga = run_relay("inspect", "olga", "--redis-url", server.url).stdout
    assert "oldest unacked" in olga and "(1m " in olga and "s), entry " in olga
    everyone = run_relay("inspect", "--redis-url", server.url, "--limit", "2")
    assert everyone.returncode == 0, everyone.stderr
    assert everyone.stdout.splitlines()[-1].endswith("showing the first 2 by id (--limit)")
    assert "\nalice\n" in f"\n{everyone.stdout}" and "\nolga\n" not in everyone.stdout


def test_inspect_errors_are_one_line(server: EmbeddedRedis) -> None:
    nowhere = {"RELAY_DATA_DIR": "/nonexistent/relay-data"}  # no embedded server runs from there
    one_error_line(run_relay("inspect", env=nowhere), 2, "--redis-url", "RELAY_REDIS_URL", "--data-dir")
    one_error_line(run_relay("inspect", "Bad!", "--redis-url", server.url), 2, "AGENT")
    one_error_line(run_relay("inspect", "--redis-url", "http://x"), 2, "not a Redis URL")
    one_error_line(run_relay("inspect", "nobody", "--redis-url", server.url), 1, "'nobody' is not registered")
    url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    one_error_line(run_relay("inspect", "--redis-url", url), 1, f"cannot read Redis at {url}")


def test_relay_serve_exports_the_inbox_gauges(server: EmbeddedRedis, tmp_path: Path) -> None:
    args = ["--redis-url", server.url, "--data-dir", str(tmp_path / "data")]  # its key goes there
    worker = ServeProcess(args, tmp_path / "serve.log").start()
    try:
        metrics = worker.metrics()
    finally:
        assert worker.stop() == 0
    assert sample(metrics, "csf_relay_inbox_depth", agent="bob") == 3
    assert sample(metrics, "csf_relay_inbox_pending", agent="bob") == 1
    assert sample(metrics, "csf_relay_dead_letter_depth", agent="bob") == 2
    assert 0 <= sample(metrics, "csf_relay_inbox_oldest_unacked_seconds", agent="bob") < 60
    assert sample(metrics, "csf_relay_inbox_oldest_unacked_seconds", agent="olga") >= OLD_SECONDS
    assert sample(metrics, "csf_relay_inbox_oldest_unacked_seconds", agent="alice") == 0
    assert sample(metrics, "csf_relay_registered_agents", tier="host") == 3
    assert sample(metrics, "csf_relay_registered_agents", tier="in_process") == 1
    assert sample(metrics, "csf_relay_registered_agents", tier="network") == 0
    assert sample(metrics, "csf_relay_total_inbox_depth") == 4
    assert sample(metrics, "csf_relay_total_inbox_pending") == 1
    assert sample(metrics, "csf_relay_total_dead_letter_depth") == 2
    assert sample(metrics, "csf_relay_max_inbox_oldest_unacked_seconds") >= OLD_SECONDS
    assert sample(metrics, "csf_relay_inspection_agents", set="indexed") == 4
    assert sample(metrics, "csf_relay_inspection_agents", set="covered") == 4
    assert sample(metrics, "csf_relay_inspection_up") == 1


async def test_gauges_do_bounded_work_per_scrape_and_cover_every_agent(server: EmbeddedRedis) -> None:
    keys = Keys(unique_prefix())
    sync = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
    connection = RedisConnection(RedisSettings(url=server.url, prefix=keys.prefix))
    agents = [f"agent-{i}" for i in range(7)]
    for i, agent in enumerate(agents):
        sync.hset(keys.registration(agent), mapping={"agent": agent, "tier": "host", "session": "s"})
        for _ in range(i):
            sync.xadd(keys.inbox(agent), {"text": "x"})
    sync.xadd(keys.dead_letters("agent-0"), {"reason": "r"})
    sync.function_load(connection.scripts.library.source, replace=True)
    gauges = InboxGauges(connection, batch=3, max_series=3)

    def script_calls() -> int:
        stats = sync.info("commandstats").get("cmdstat_fcall", {"calls": 0})
        return int(stats["calls"])

    def value(name: str, **labels: str) -> float:
        found = [
            s.value
            for family in gauges.collect()
            for s in family.samples
            if s.name == name and s.labels == labels
        ]
        return found[0] if found else -1.0

    try:
        covered = []
        for _ in range(3):
            calls = script_calls()
            await gauges.refresh()
            assert script_calls() - calls <= 3
            covered.append(value("csf_relay_inspection_agents", set="covered"))
        assert covered == [3, 6, 7]
        assert value("csf_relay_inspection_agents", set="indexed") == 7
        assert value("csf_relay_total_inbox_depth") == sum(range(7))
        assert value("csf_relay_total_dead_letter_depth") == 1
        labelled = [i.agent for i in gauges.labelled()]
        # the worst by oldest unacknowledged (agent-1 was written to first), backlog and dead letters
        assert labelled == ["agent-0", "agent-1", "agent-6"]
        assert value("csf_relay_inbox_depth", agent="agent-6") == 6
        assert value("csf_relay_inbox_depth", agent="agent-3") == -1

        sync.delete(keys.registration("agent-6"))
        for _ in range(3):
            await gauges.refresh()
        assert value("csf_relay_inspection_agents", set="covered") == 6
        assert value("csf_relay_total_inbox_depth") == sum(range(6))
    finally:
        await connection.close()
        sync.close()


async def test_inspector_reads_what_relay_wrote(server: EmbeddedRedis) -> None:
    connection = RedisConnection(RedisSettings(url=server.url, prefix=KEYS.prefix))
    try:
        inspector = Inspector(connection)
        assert await inspector.agent_ids(10) == ["alice", "bob", "olga", "wendy"]
        nobody, bob = await inspector.inspect(["nobody", "bob"])
        assert not nobody.exists and nobody.registered is False and nobody.inbox_depth == 0
        assert bob.exists and (bob.inbox_depth, bob.pending, bob.dead_letters) == (3, 1, 2)
    finally:
        await connection.close()


async def test_a_failing_refresh_still_serves_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    gauges = InboxGauges(
        RedisConnection(RedisSettings(url="redis://127.0.0.1:1/0", connect_timeout=1, command_timeout=1))
    )
    with pytest.raises(BackendUnavailable):
        await gauges.refresh()
    state = MemoryState()
    relay = Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state))
    relay.metrics.registry.register(gauges)
    assert b"csf_relay_inspection_up 0.0" in generate_latest(relay.metrics.registry)

    never = asyncio.Event()

    async def hangs() -> None:
        await never.wait()

    monkeypatch.setattr(front.app, "METRICS_REFRESH_TIMEOUT", 0.05)
    for hook in (gauges.refresh, hangs):
        app = create_app(relay, keyring=None, before_metrics=hook)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://relay") as http:
            response = await asyncio.wait_for(http.get("/metrics"), 10)
        assert response.status_code == 200
        assert "csf_relay_inspection_up 0.0" in response.text


def test_gauge_names_clash_with_no_other_relay_metric() -> None:
    registry = CollectorRegistry()
    RelayMetrics(registry)
    registry.register(
        InboxGauges(RedisConnection(RedisSettings(url="redis://127.0.0.1:1/0")))
    )  # raises on a clash
    families = [f.name for f in text_string_to_metric_families(generate_latest(registry).decode())]
    assert len(families) == len(set(families)), families
    with pytest.raises(ValueError, match="Duplicated"):
        Gauge("csf_relay_inbox_depth", "clash", registry=registry)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (4.25, "4.2 s"),
        (75, "75.0 s (1m 15s)"),
        (3725, "3725.0 s (1h 2m 5s)"),
        (90061, "90061.0 s (1d 1h 1m 1s)"),
    ],
)
def test_ages_are_seconds_then_readable(seconds: float | None, text: str) -> None:
    assert human_age(seconds) == text
