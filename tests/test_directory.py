"""The agent directory's index (``adapters/redis/directory.py``), on one Redis and on a 3-master
cluster: listings after registrations and a retirement, a register refused after its id went in, a
store written before the index (listed by the scan, then indexed by ``relay migrate`` or the first
listing), a listing that issues no ``SCAN`` among 200,000 unrelated keys, a listing while a
registration's slot moves between masters, and a register that cannot write the index registers
nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.directory import Directory, Walk
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.gauges import InboxGauges
from adapters.redis.keys import Keys
from adapters.redis.operator_view import RedisOperatorView
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.errors import AgentRetired, BackendUnavailable
from broker.relay import Relay
from tests.cluster_support import LocalCluster, set_slot, slot_move
from tests.processes import run_relay
from tests.support import address_for, old_registration, unique_prefix

UNRELATED = 200_000
"""Keys of something else in the same Redis, for the cost test."""
FILL_CHUNK = 10_000


@pytest.fixture(params=["one", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if request.param == "one" else "cluster_url"))


@dataclass
class Store:
    """A relay's Redis stores on a fresh prefix, and a plain client to look at the keys with."""

    url: str
    keys: Keys
    connection: RedisConnection
    registry: RedisRegistry
    raw: Any  # redis.Redis or redis.RedisCluster (synchronous)

    @property
    def directory(self) -> Directory:
        return self.registry.directory

    def index(self) -> list[str]:
        return [str(a) for a in self.raw.zrange(self.keys.directory(), 0, -1)]

    def write_old_registration(self, agent: str) -> None:
        """A registration hash as relay wrote it before the index (and redis-cli could)."""
        self.raw.hset(self.keys.registration(agent), mapping=old_registration(agent))

    def forget_the_index(self) -> None:
        """What a store written before the index lacks: the index and its marker."""
        self.raw.delete(self.keys.directory())
        self.raw.delete(self.keys.directory_built())

    def scan_calls(self) -> int:
        """``SCAN`` calls the server (every master of a cluster) has answered so far."""
        nodes = (
            [redis.Redis(host=n.host, port=n.port) for n in self.raw.get_primaries()]
            if isinstance(self.raw, redis.RedisCluster)
            else [redis.Redis.from_url(self.url)]
        )
        total = 0
        for node in nodes:
            with node:
                total += int(node.info("commandstats").get("cmdstat_scan", {"calls": 0})["calls"])
        return total


def _raw_client(url: str) -> Any:
    with redis.Redis.from_url(url, decode_responses=True) as probe:
        cluster = bool(int(probe.info("cluster").get("cluster_enabled", 0)))
    if cluster:
        return redis.RedisCluster.from_url(url, decode_responses=True)
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)


@contextlib.asynccontextmanager
async def store_on(url: str) -> AsyncIterator[Store]:
    keys = Keys(unique_prefix())
    connection = RedisConnection(RedisSettings(url=url, prefix=keys.prefix))
    await connection.open()
    raw = _raw_client(url)
    try:
        yield Store(url, keys, connection, RedisRegistry(connection), raw)
    finally:
        await connection.delete_prefix()
        await connection.close()
        raw.close()


async def register(store: Store, *agents: str) -> None:
    for agent in agents:
        await store.registry.register(agent, address_for(Tier.HOST, agent), f"{agent}-1")


async def walk_all(directory: Directory, count: int) -> list[str]:
    """A gauges-like walk, page after page of ``count``, to its end."""
    walk = Walk()
    found: list[str] = []
    for _ in range(1000):
        found += await directory.page(walk, count)
        if walk.done:
            return found
    raise AssertionError("the walk did not end")


async def test_a_listing_after_registrations_and_a_retirement(url: str) -> None:
    async with store_on(url) as store:
        agents = [f"agent-{i:02d}" for i in range(25)]
        await register(store, *reversed(agents))
        await register(store, "agent-03")  # again: nothing changes in the index
        await store.registry.retire("agent-07")
        await store.registry.retire("agent-11", purge=True)
        left = [a for a in agents if a not in ("agent-07", "agent-11")]
        assert store.index() == left  # nothing retired is left in the index
        assert await store.directory.agents() == left
        pages: list[str] = []
        after = None
        for _ in range(10):
            page = await store.registry.list(limit=4, after=after)
            pages += [r.agent for r in page]
            if len(page) < 4:
                break
            after = page[-1].agent
        assert pages == left
        assert [r.agent for r in await store.registry.list(limit=3, after="agent-06")] == [
            "agent-08",
            "agent-09",
            "agent-10",
        ]
        assert await walk_all(store.directory, 6) == left
        view = RedisOperatorView(store.connection)
        page = await view.agents(limit=5, after="agent-20")
        assert [a.agent for a in page.agents] == ["agent-21", "agent-22", "agent-23", "agent-24"]
        assert page.total == len(left)


async def test_a_register_refused_after_its_id_went_in_is_not_listed(url: str) -> None:
    async with store_on(url) as store:
        await register(store, "alice", "bob")
        await store.registry.retire("bob")
        with pytest.raises(AgentRetired):
            await register(store, "bob")  # its retired session: register.lua refuses, after the ZADD
        assert store.index() == ["alice", "bob"]  # the id went in first ...
        assert await store.directory.agents() == ["alice"]  # ... and no listing shows it
        assert [r.agent for r in await store.registry.list()] == ["alice"]
        assert [r.agent for r in await store.registry.list(limit=1)] == ["alice"]
        assert await store.registry.list(limit=1, after="alice") == []
        assert await walk_all(store.directory, 1) == ["alice"]
        page = await RedisOperatorView(store.connection).agents()
        assert [a.agent for a in page.agents] == ["alice"] and page.total == 1
        gauges = InboxGauges(store.connection)
        await gauges.refresh()
        assert [i.agent for i in gauges.labelled()] == ["alice"]
        await store.registry.retire("bob")  # retiring again takes the stale id out
        assert store.index() == ["alice"]


async def test_a_retirement_keeps_an_agent_registered_again_meanwhile(url: str) -> None:
    """The two orders in which a register and a retirement of one agent can interleave, forced."""
    async with store_on(url) as store:
        await register(store, "bob")
        await store.directory.leave("bob")  # a retirement's removal after bob registered again
        assert store.index() == ["bob"]
        await store.registry.retire("bob")
        assert store.index() == []
        script = store.connection.script

        async def retirement_removes_the_id_first(*args: Any, **kwargs: Any) -> Any:
            store.raw.zrem(store.keys.directory(), "bob")  # between the register's ZADD and its script
            return await script(*args, **kwargs)

        store.connection.script = retirement_removes_the_id_first  # type: ignore[method-assign]
        try:
            await store.registry.register("bob", address_for(Tier.HOST, "bob"), "bob-2")
        finally:
            del store.connection.script
        assert store.index() == ["bob"] and await store.directory.agents() == ["bob"]


async def test_a_store_written_before_the_index_is_listed_and_migrate_indexes_it(url: str) -> None:
    async with store_on(url) as store:
        old = ["carol", "dave", "erin"]
        for agent in old:
            store.write_old_registration(agent)
        await register(store, "alice")  # a new worker registers before any build
        assert store.index() == ["alice"] and not store.raw.exists(store.keys.directory_built())
        # until the marker exists, a walk is the scan (it never builds) ... of the whole server, which
        # the other tests share: pages of 500 keys, so that the walk's bound is not the test's keyspace
        assert sorted(await walk_all(store.directory, 500)) == ["alice", *old]
        assert [r.agent for r in await store.registry.list(limit=2)] == ["alice", "carol"]
        # ... and the first listing, which scans anyway, builds the index
        assert store.index() == ["alice", *old] and store.raw.exists(store.keys.directory_built())

        store.forget_the_index()
        store.write_old_registration("frank")
        dry = run_relay("migrate", "--redis-url", url, "--prefix", store.keys.prefix, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "would index 5 agent ids in the directory" in dry.stdout, dry.stdout
        assert store.index() == [] and not store.raw.exists(store.keys.directory_built())
        first = run_relay("migrate", "--redis-url", url, "--prefix", store.keys.prefix)
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("indexed 5 agent ids in the directory (5 agents)"), first.stdout
        assert store.index() == ["alice", *old, "frank"] and store.raw.exists(store.keys.directory_built())
        again = run_relay("migrate", "--redis-url", url, "--prefix", store.keys.prefix)
        assert again.returncode == 0 and again.stdout.startswith("nothing to migrate"), again

        # a worker of the earlier relay registering after the first build: migrate adds it
        store.write_old_registration("gina")
        late = run_relay("migrate", "--redis-url", url, "--prefix", store.keys.prefix)
        assert late.stdout.startswith("indexed 1 agent id in the directory (6 agents)"), late.stdout
        assert await store.directory.agents() == ["alice", *old, "frank", "gina"]


@contextlib.contextmanager
def unrelated_keys(store: Store) -> Iterator[None]:
    """``UNRELATED`` short keys of something else (pipelined ``SET``s), deleted afterwards."""
    names = [f"{store.keys.prefix}-other:{i}" for i in range(UNRELATED)]
    try:
        for start in range(0, len(names), FILL_CHUNK):
            pipe = store.raw.pipeline(transaction=False)
            for name in names[start : start + FILL_CHUNK]:
                pipe.set(name, "x")
            pipe.execute()
        yield
    finally:
        for start in range(0, len(names), FILL_CHUNK):
            pipe = store.raw.pipeline(transaction=False)
            for name in names[start : start + FILL_CHUNK]:
                pipe.unlink(name)
            pipe.execute()


async def test_a_listing_issues_no_scan_whatever_else_redis_holds(url: str) -> None:
    async with store_on(url) as store, contextlib.AsyncExitStack() as stack:
        contract = AgentMessageContract()
        relay = Relay(contract, RedisInboxStore(store.connection), store.registry)
        await stack.enter_async_context(relay)
        agents = [f"agent-{i:02d}" for i in range(20)]
        await register(store, *agents)
        ask = await relay.send("agent-00", "agent-01", AgentMessage(kind=Kind.KIND_REQUEST, text="review?"))
        reply = AgentMessage(kind=Kind.KIND_REPLY, text="done", in_reply_to=ask.id)
        await relay.send("agent-01", "agent-00", reply)
        stack.enter_context(unrelated_keys(store))
        view = RedisOperatorView(store.connection)
        before = store.scan_calls()
        await store.directory.agents()  # a fresh store: the first listing builds the index (a scan)
        assert store.scan_calls() > before
        before = store.scan_calls()
        assert len(await view.thread(ask.id)) == 2
        assert await store.directory.agents() == agents
        assert len(await store.registry.list(limit=5)) == 5
        assert (await view.agents()).total == 20
        gauges = InboxGauges(store.connection, batch=7)
        for _ in range(4):
            await gauges.refresh()
        assert store.scan_calls() == before  # a count, not a timing


async def test_a_register_that_cannot_write_the_index_registers_nothing() -> None:
    server = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"])
    server.start()
    raw = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        async with store_on(server.url) as store:
            await register(store, "alice")  # the scripts are loaded
            raw.config_set("maxmemory", 1)  # every write is refused: out of memory
            scripts = int(raw.info("commandstats")["cmdstat_fcall"]["calls"])
            with pytest.raises(BackendUnavailable, match="out of memory"):
                await register(store, "bob")
            assert int(raw.info("commandstats")["cmdstat_fcall"]["calls"]) == scripts  # no script ran
            raw.config_set("maxmemory", 0)
            assert not raw.exists(store.keys.registration("bob")) and store.index() == ["alice"]
            assert await store.registry.get("bob") is None
    finally:
        raw.close()
        server.stop()


async def test_a_listing_follows_a_registration_whose_slot_is_moving(redis_cluster: LocalCluster) -> None:
    """Mid-resharding: the registration hash already moved to the importing master, so its old master
    answers the listing's EXISTS with ASK; once the whole slot moved, with MOVED. The slot stays on
    its new master (a resharding done, as a cluster may have at any time)."""
    async with store_on(redis_cluster.url) as store:
        mover = unique_prefix()  # an agent id whose slot no other test's agent shares by name
        await register(store, "alice", mover)
        assert await store.directory.agents() == sorted(["alice", mover])  # (builds: a fresh store)
        key = store.keys.registration(mover)
        move = slot_move(redis_cluster, key)
        slot, target_port, target_id = move.slot, move.target_port, move.target_id
        with redis.Redis(host="127.0.0.1", port=move.source_port, decode_responses=True) as client:
            set_slot(target_port, slot, "IMPORTING", move.source_id)
            set_slot(move.source_port, slot, "MIGRATING", target_id)
            try:
                client.execute_command("MIGRATE", "127.0.0.1", target_port, key, 0, 5000)
                assert await store.directory.agents() == sorted(["alice", mover])  # through ASK
                for _ in range(1000):  # the rest of the slot, then its new owner, as redis-cli does
                    rest = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                    if not rest:
                        break
                    client.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *rest)
                for port in (target_port, move.source_port, *move.others):
                    set_slot(port, slot, "NODE", target_id)
            except BaseException:
                for port in (move.source_port, target_port):
                    set_slot(port, slot, "STABLE")
                raise
        assert await store.directory.agents() == sorted(["alice", mover])  # through MOVED
