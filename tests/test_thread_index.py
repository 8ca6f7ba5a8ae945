"""The thread index on Redis (``adapters/redis/threads.py``): the walk finds a thread from its own
envelopes only, on one Redis and on a 3-master cluster; a store without the index still gets its
threads indexed by ``relay migrate``."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.migrate import migrate
from adapters.redis.operator_view import RedisOperatorView
from adapters.redis.threads import walk
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Tier
from broker.relay import Relay
from tests.support import address_for, unique_prefix


def note(text: str) -> AgentMessage:
    return AgentMessage(kind=Kind.KIND_NOTE, text=text)


def answer(text: str, to: str) -> AgentMessage:
    return AgentMessage(kind=Kind.KIND_REPLY, text=text, in_reply_to=to)


@pytest.fixture(params=["one", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if request.param == "one" else "cluster_url"))


@contextlib.asynccontextmanager
async def relay_and_view(url: str) -> AsyncIterator[tuple[Relay[AgentMessage], RedisOperatorView]]:
    settings = RedisSettings(url=url, prefix=unique_prefix())
    connection = RedisConnection(settings)
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    view = RedisOperatorView(RedisConnection(settings))
    async with relay:
        await view.open()
        try:
            for agent in ("alice", "bob", "carol", "dave"):
                await relay.register(agent, address_for(Tier.HOST, agent), f"s-{agent}")
            yield relay, view
        finally:
            await view.close()


async def test_the_walk_finds_a_thread_both_ways_across_inboxes_and_histories(url: str) -> None:
    async with relay_and_view(url) as (relay, view):
        ask = (await relay.send("alice", "bob", note("review?"))).id
        reply = (await relay.send("bob", "alice", answer("done", ask))).id
        follow = (await relay.send("alice", "bob", answer("and tests?", ask))).id
        deeper = (await relay.send("bob", "alice", answer("those too", reply))).id
        for n in range(20):  # unrelated mail around it, some of it acknowledged
            await relay.send("carol", "dave", note(f"other {n}"))
        await relay.send("carol", "bob", answer("not this one's", "env_00000000000000000000000000"))
        for agent in ("bob", "dave"):
            got = await relay.fetch(agent, 50)
            await relay.ack(agent, [e.id for e in got])
        thread = {ask, reply, follow, deeper}
        agents = ["alice", "bob", "carol", "dave"]
        for start in thread:
            found = await walk(view.connection, start, agents)
            assert {e.envelope_id for e in found} == thread, start
            shown = [e.envelope_id for e in await view.thread(start)]
            assert shown[0] == ask and set(shown) == thread
        (archived,) = [e for e in found if e.envelope_id == ask]
        assert archived.fields["text"] == "review?" and archived.to == "bob"


async def test_a_requeued_envelope_is_found_by_its_old_id(url: str) -> None:
    async with relay_and_view(url) as (relay, view):
        queue = RedisDeliveryQueue(view.connection)
        ask = (await relay.send("alice", "bob", note("build it"))).id
        (claimed,) = await queue.claim("bob", "bob@loop", 1, visibility=30.0)
        assert await queue.dead_letter("bob", claimed.envelope_id, "RuntimeError: boom", consumer="bob@loop")
        (now,) = await queue.requeue("bob")
        late = (await relay.send("alice", "bob", answer("still?", ask))).id
        found = {e.envelope_id for e in await walk(view.connection, ask, ["alice", "bob"])}
        assert {now, late} <= found
        assert {e.envelope_id for e in await view.thread(ask)} == {now, late}


async def test_relay_migrate_indexes_the_replies_of_a_store_without_the_index(url: str) -> None:
    async with relay_and_view(url) as (relay, view):
        ask = (await relay.send("alice", "bob", note("old"))).id
        reply = (await relay.send("bob", "alice", answer("older", ask))).id
        client = aioredis.RedisCluster.from_url(url) if "cluster" in url else aioredis.Redis.from_url(url)
        prefix = view.keys.prefix
        try:  # as a store written before the index: no replies index, no history positions
            async for key in client.scan_iter(match=f"{prefix}:replies:*"):
                await client.delete(key)
        finally:
            await client.aclose()
        # the walk from the reply still finds what it answers (in_reply_to); from the question, only
        # the question, until relay migrate notes the reply
        assert {e.envelope_id for e in await walk(view.connection, reply, ["alice", "bob"])} == {reply, ask}
        assert [e.envelope_id for e in await view.thread(ask)] == [ask]
        assert (await migrate(view.connection)).replies_indexed == 1
        assert (await migrate(view.connection)).replies_indexed == 0  # idempotent
        assert [e.envelope_id for e in await view.thread(ask)] == [ask, reply]


async def test_a_thread_read_loads_only_its_thread_not_the_stores_texts(url: str) -> None:
    """The +26 MB case of issue 26: a thread of 6 among 200 envelopes of 60 KB, in inboxes and
    histories; the worker's allocations while reading the thread stay far below one tenth of them."""
    async with relay_and_view(url) as (relay, view):
        big = "x" * 60_000
        for n in range(200):
            await relay.send("carol", "dave" if n % 2 else "bob", note(f"{n} {big}"))
        for agent in ("dave",):
            got = await relay.fetch(agent, 200)
            await relay.ack(agent, [e.id for e in got])
        last = ask = (await relay.send("alice", "bob", note("small question"))).id
        for hop in range(5):
            frm, to = ("bob", "alice") if hop % 2 == 0 else ("alice", "bob")
            last = (await relay.send(frm, to, answer(f"small answer {hop}", last))).id
        await view.thread(ask)  # scripts loaded, connections open: what follows is the read alone
        tracemalloc.start()
        try:
            shown = await view.thread(last)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(shown) == 6 and shown[0].envelope_id == ask
        assert peak < 1_200_000, peak  # 200 x 60 KB = 12 MB stored
