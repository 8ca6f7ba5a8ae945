"""A Redis at ``maxmemory`` (``noeviction``) can still be drained: over MCP (the official ``mcp`` client
against the real app), sends fill a real Redis started with a small limit until they are refused as
out of memory; the mail-pending wait still answers, every envelope is fetched and acknowledged, and
sends work again. Also when relay's functions library is gone once the store is full (a worker of
another relay version, a ``FUNCTION FLUSH``): Redis refuses to load it there, and the calls run as
``EVAL`` until it has room again."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
import redis

from adapters.redis import scripts
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.scripts import Scripts
from broker.front.paths import WAIT_PATH
from tests.front_support import data, error, running_front
from tests.processes import REGISTER

pytestmark = pytest.mark.asyncio

HEADROOM = 128 * 1024
"""Bytes of room above what the store holds once both agents are registered."""
MOST_SENDS = 5000
TEXT = "please review this change; " * 16


@pytest.fixture
def small_redis() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(extra_args=["--maxmemory-policy", "noeviction"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("library", ["loaded", "flushed at maxmemory"])
async def test_a_store_at_maxmemory_is_drained_and_sends_resume(
    small_redis: EmbeddedRedis, library: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without history (``--history-retention 0``): acknowledging frees what the envelopes held. With
    history the acknowledged envelopes stay in it until the retention trims them (docs/history.md), so
    draining alone does not make room."""
    store = redis.Redis.from_url(small_redis.url, decode_responses=True)
    send = {"to": "bob", "message": {"kind": 1, "text": TEXT}}
    try:
        async with (
            running_front(small_redis.url, history_retention_ms=0) as front,
            front.client("alice", "a-1") as alice,
            front.client("bob", "b-1") as bob,
        ):
            for client in (alice, bob):
                data(await client.call_tool("RegisterAgentAddress", REGISTER))
            # once through every script first: loading them takes memory of its own
            warm = data(await alice.call_tool("SendAgentMessage", send))["id"]
            data(await bob.call_tool("FetchAgentInbox", {"limit": 16}))
            data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": [warm]}))
            used = int(store.info("memory")["used_memory"])
            store.config_set("maxmemory", used + HEADROOM)
            sent: list[str] = []
            for _ in range(MOST_SENDS):
                result = await alice.call_tool("SendAgentMessage", send)
                if result.is_error:
                    refused = error(result)
                    break
                sent.append(data(result)["id"])
            else:
                pytest.fail(f"{MOST_SENDS} sends never reached maxmemory")
            assert refused["code"] == "backend_unavailable" and "out of memory" in refused["message"]
            assert len(sent) > 50, len(sent)
            if library != "loaded":
                monkeypatch.setattr(scripts, "REFUSED_FOR", 0.0)  # each call tries the load again
                store.function_flush()
                with pytest.raises(redis.exceptions.OutOfMemoryError):  # what the next calls meet
                    store.function_load(Scripts().library.source)

            # the mail-pending wait still answers (the wake-up an idle Claude Code session drains on)
            async with httpx2.AsyncClient(timeout=30) as http:
                woken = await http.post(
                    front.base + WAIT_PATH, json={"timeout_ms": 0}, headers=front.headers("bob", "b-1")
                )
            assert (woken.status_code, woken.json()["count"]) == (200, len(sent)), woken.text

            (queued,) = data(await alice.call_tool("GetMessageStatus", {"ids": sent[:1]}))["statuses"]
            assert queued["state"] == "queued"

            drained: list[str] = []
            for _ in range(len(sent)):  # one envelope a round at least, or the test fails
                got = data(await bob.call_tool("FetchAgentInbox", {"limit": 16}))["envelopes"]
                if not got:
                    break
                ids = [e["id"] for e in got]
                done = data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": ids}))
                assert (done["acknowledged"], done["unknown"]) == (ids, [])
                drained += ids
            assert drained == sent

            again = data(await alice.call_tool("SendAgentMessage", send))
            got = data(await bob.call_tool("FetchAgentInbox", {"limit": 16}))["envelopes"]
            assert [e["id"] for e in got] == [again["id"]]
            assert [entry[1] for entry in store.function_list()] == [Scripts().library.name]  # library_name
    finally:
        store.close()
