"""The Redis client stack under pressure and refusal: cold starts, flushed functions, restarts,
refusals that are not the store being down, ACL users, and ``WAIT`` for replicas. Each test starts its
own server on a free loopback port (they flush scripts, restart, and change ACLs)."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.scripts import Scripts
from broker.agent_message import AgentMessage
from broker.envelope import Tier
from broker.errors import BackendRefused, BackendUnavailable, RelayError
from broker.relay import Relay
from tests.cluster_support import find_cli
from tests.support import address_for, note, relay_on

ROOT = Path(__file__).resolve().parents[1]

SENDS = 500


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis()
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


def library_loads(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_function|load", {"calls": 0})["calls"])


async def burst(relay: Relay[AgentMessage], count: int) -> list[BaseException | object]:
    return await asyncio.gather(
        *(relay.send(f"s{i % 50}", "sink", note(i)) for i in range(count)), return_exceptions=True
    )


async def test_500_concurrent_cold_sends_and_again_after_a_function_flush_all_land(
    server: EmbeddedRedis,
) -> None:
    sync = redis.Redis.from_url(server.url, decode_responses=True)
    async with relay_on(server.url, max_connections=8) as relay:
        for name in ["sink", *(f"s{i}" for i in range(50))]:
            await relay.register(name, address_for(Tier.HOST, name), "s1")
        sync.function_flush()
        sync.config_resetstat()
        results = await burst(relay, SENDS)
        refused = [r for r in results if isinstance(r, BaseException)]
        assert refused == []
        assert library_loads(sync) == 1  # relay's library, once

        sync.function_flush()  # what a Redis restart without persistence does to the functions
        sync.config_resetstat()
        results = await burst(relay, SENDS)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert library_loads(sync) == 1
        received = 0
        for _ in range(2 * SENDS // 256 + 2):
            got = await relay.fetch("sink", 256)
            if not got:
                break
            received += len(got)
            await relay.ack("sink", [e.id for e in got])
        assert received == 2 * SENDS
    sync.close()


def library_recipes() -> list[str]:
    """The redis-cli lines of docs/operations.md's block about relay's functions library."""
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = [part.split("```", 1)[0] for part in text.split("```sh")[1:]]
    (block,) = [b for b in blocks if "FUNCTION LIST" in b]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.startswith("redis-cli")]


@pytest.mark.skipif(find_cli() is None, reason="redis-cli is not installed (apt-get install redis-tools)")
async def test_an_older_library_is_listed_and_deleted_as_the_operations_recipe_says(
    server: EmbeddedRedis,
) -> None:
    cli = find_cli()
    assert cli is not None
    listing, deleting = library_recipes()
    older = deleting.split()[-1]
    sync = redis.Redis.from_url(server.url, decode_responses=True)
    sync.function_load(
        f"#!lua name={older}\nredis.register_function('{older}_send', function() return 0 end)"
    )
    async with relay_on(server.url) as relay:
        await relay.register("alice", address_for(Tier.HOST, "alice"), "a")
        current = Scripts().library.name

        def run(line: str) -> str:
            args = [cli, "-p", str(server.port), *shlex.split(line)[1:]]
            return subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout

        assert {older, current} <= set(run(listing).split())
        assert run(deleting).strip() == "OK"
        assert older not in run(listing).split() and current in run(listing).split()
        sync.function_delete(current)  # deleted while its worker runs: loaded again by the next call
        await relay.send("alice", "alice", note(0))
        assert current in run(listing).split()
    sync.close()


async def test_the_first_request_after_a_redis_restart_succeeds_and_parked_polls_wake(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data", appendfsync="always")
    server.start()
    try:
        async with relay_on(server.url) as relay:
            await relay.register("alice", address_for(Tier.HOST, "alice"), "a")
            await relay.register("bob", address_for(Tier.HOST, "bob"), "b")
            await relay.send("alice", "bob", note(0))
            server.restart()
            sent = await relay.send("alice", "bob", note(1))  # pooled connections are stale: not an error
            got = await relay.fetch("bob", 16)
            assert [e.message.text for e in got] == ["note 0", "note 1"]
            await relay.ack("bob", [e.id for e in got])
            assert sent.id == got[1].id

            parked = asyncio.create_task(relay.fetch("bob", 16, wait=20.0))
            for _ in range(500):
                if relay.parked_fetches("bob"):
                    break
                await asyncio.sleep(0.01)
            server.restart()  # the subscription is lost and comes back: the poll still wakes
            late = await relay.send("alice", "bob", note(2))
            assert [e.id for e in await asyncio.wait_for(parked, 15)] == [late.id]
    finally:
        server.stop()


async def test_a_key_of_the_wrong_type_is_a_refusal_not_an_outage(server: EmbeddedRedis) -> None:
    sync = redis.Redis.from_url(server.url, decode_responses=True)
    async with relay_on(server.url) as relay:
        for name in ("alice", "bob"):
            await relay.register(name, address_for(Tier.HOST, name), "s")
        keys = relay._inbox.keys  # type: ignore[attr-defined]
        sync.delete(keys.inbox("bob"))
        sync.set(keys.inbox("bob"), "not a stream")
        with pytest.raises(BackendRefused) as refused:
            await relay.send("alice", "bob", note(0))
        assert refused.value.retryable is False and refused.value.code == "backend_refused"
        assert "WRONGTYPE" in refused.value.message
        assert "user_script" not in refused.value.message and "script:" not in refused.value.message
        assert await relay.ready()  # the store is fine
    sync.close()


async def test_acl_users_work_and_a_missing_permission_is_not_retryable(server: EmbeddedRedis) -> None:
    sync = redis.Redis.from_url(server.url, decode_responses=True)
    sync.acl_setuser(
        "relay", enabled=True, passwords=["+s3cret"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    sync.acl_setuser(
        "reader",
        enabled=True,
        passwords=["+r3ad"],
        keys=["*"],
        channels=["*"],
        commands=["+@read", "+info", "+ping", "+cluster"],
    )
    host_port = server.url.removeprefix("redis://").removesuffix("/0")
    async with relay_on(f"redis://relay:s3cret@{host_port}/0") as relay:
        for name in ("alice", "bob"):
            await relay.register(name, address_for(Tier.HOST, name), "s")
        sent = await relay.send("alice", "bob", note(0))
        assert [e.id for e in await relay.fetch("bob", 16)] == [sent.id]
    async with relay_on(f"redis://reader:r3ad@{host_port}/0") as relay:
        with pytest.raises(BackendRefused) as refused:
            await relay.register("carol", address_for(Tier.HOST, "carol"), "s")
        assert not refused.value.retryable and "NOPERM" in refused.value.message
    async with relay_on(f"redis://relay:wrong@{host_port}/0") as relay:
        with pytest.raises(RelayError) as denied:
            await relay.register("carol", address_for(Tier.HOST, "carol"), "s")
        assert denied.value.code == "backend_unavailable"
    sync.close()


async def test_wait_replicas_answers_only_when_a_replica_holds_the_write(server: EmbeddedRedis) -> None:
    async with relay_on(server.url, wait_replicas=1, command_timeout=1.0) as relay:
        with pytest.raises(BackendUnavailable) as behind:
            await relay.register("alice", address_for(Tier.HOST, "alice"), "a")
        assert "replicas" in behind.value.message and behind.value.retryable
    replica = EmbeddedRedis(extra_args=["--replicaof", "127.0.0.1", str(server.port)])
    replica.start()
    try:
        sync = redis.Redis(port=replica.port, decode_responses=True)
        for _ in range(500):
            if sync.info("replication").get("master_link_status") == "up":
                break
            await asyncio.sleep(0.02)
        async with relay_on(server.url, wait_replicas=1) as relay:
            for name in ("alice", "bob"):
                await relay.register(name, address_for(Tier.HOST, name), "s")
            sent = await relay.send("alice", "bob", note(0))
            keys = relay._inbox.keys  # type: ignore[attr-defined]
            assert sync.xlen(keys.inbox("bob")) == 1  # on the replica when the send answered
            got = await relay.fetch("bob", 16)
            assert (await relay.ack("bob", [e.id for e in got])).acknowledged == (sent.id,)
            assert sync.xlen(keys.inbox("bob")) == 0
        sync.close()
    finally:
        replica.stop()
