"""Idempotent send, expiry, the poison limit and the sender's status over MCP: the official ``mcp``
client against a real ``relay serve --max-deliveries 3`` process on its own Redis."""

from __future__ import annotations

import contextlib
import json
import time
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
from broker.testing.polling import eventually
from tests.front_support import data, error, key_file
from tests.processes import REGISTER, ServeProcess, run_relay, sample, serve_processes

pytestmark = pytest.mark.asyncio

KEYS = Keys()


@dataclass
class Worker:
    process: ServeProcess
    store: redis.Redis
    url: str
    keyring: KeyRing

    @contextlib.asynccontextmanager
    async def agent(self, name: str) -> AsyncIterator[Client]:
        """An MCP client of agent ``name``, registered."""
        headers = agent_headers(self.keyring, name, f"{name}-1")
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
        async with http, Client(streamable_http_client(self.process.url, http_client=http)) as client:
            data(await client.call_tool("RegisterAgentAddress", REGISTER))
            yield client


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    tmp = tmp_path_factory.mktemp("delivery")
    server = EmbeddedRedis()
    server.start()
    try:
        key = key_file(tmp)
        args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key), "--max-deliveries", "3"]
        with serve_processes(tmp, 1, *args) as (process,):
            store = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
            yield Worker(process, store, server.url, load_key_file(key))
            store.close()
    finally:
        server.stop()


async def send(client: Client, to: str, text: str, **options: Any) -> dict[str, Any]:
    return data(
        await client.call_tool(
            "SendAgentMessage", {"to": to, "message": {"kind": 1, "text": text}, **options}
        )
    )


async def fetch_ids(client: Client) -> list[str]:
    envelopes = data(await client.call_tool("FetchAgentInbox", {"limit": 16}))["envelopes"]
    return [e["id"] for e in envelopes]


async def status(client: Client, *ids: str) -> list[dict[str, Any]]:
    statuses: list[dict[str, Any]] = data(await client.call_tool("GetMessageStatus", {"ids": list(ids)}))[
        "statuses"
    ]
    return statuses


async def test_a_repeated_idempotency_key_gives_the_same_id_and_one_envelope(worker: Worker) -> None:
    async with worker.agent("idem-a") as alice, worker.agent("idem-b") as bob:
        first = await send(alice, "idem-b", "deploy v2", idempotency_key="deploy-v2:1")
        again = await send(alice, "idem-b", "deploy v2", idempotency_key="deploy-v2:1")
        assert again == first
        assert worker.store.xlen(KEYS.inbox("idem-b")) == 1
        assert await fetch_ids(bob) == [first["id"]]

        other = await alice.call_tool(
            "SendAgentMessage",
            {"to": "idem-b", "message": {"kind": 1, "text": "deploy v3"}, "idempotency_key": "deploy-v2:1"},
        )
        refused = error(other)
        assert (refused["code"], refused["retryable"]) == ("idempotency_conflict", False)
        bad = error(
            await alice.call_tool(
                "SendAgentMessage",
                {"to": "idem-b", "message": {"kind": 1, "text": "x"}, "idempotency_key": "a b"},
            )
        )
        assert bad["code"] == "invalid_argument" and bad["violations"][0]["field"] == "idempotency_key"
        assert worker.store.xlen(KEYS.inbox("idem-b")) == 1


async def test_an_envelope_with_a_1s_ttl_is_not_handed_out_after_1_5s_and_reads_expired(
    worker: Worker,
) -> None:
    async with worker.agent("ttl-a") as alice, worker.agent("ttl-b") as bob:
        short = await send(alice, "ttl-b", "only for a second", ttl_ms=1000)
        sent = time.monotonic()
        kept = await send(alice, "ttl-b", "no ttl")
        # the one thing this test is about is the passing of real time: wait it out, bounded
        await eventually(lambda: time.monotonic() - sent >= 1.5, 5.0, "1.5 s after the send", interval=0.05)
        assert await fetch_ids(bob) == [kept["id"]]
        (expired,) = await status(alice, short["id"])
        assert (
            expired["state"] == "expired"
            and expired["to"] == "ttl-b"
            and expired["sent_at"] == short["sent_at"]
        )
        letters = json.loads(
            run_relay("dead-letters", "list", "ttl-b", "--json", "--redis-url", worker.url).stdout
        )
        assert [(x["id"], x["reason"]) for x in letters["dead_letters"]] == [(short["id"], "expired")]
        metrics = worker.process.metrics()
        assert sample(metrics, "csf_relay_envelopes_expired_total", tier="host") >= 1
        assert sample(metrics, "csf_relay_inbox_expired", agent="ttl-b") == 1
        inspected = run_relay("inspect", "ttl-b", "--redis-url", worker.url).stdout
        assert "1 envelope expired unacknowledged" in inspected
        bad = error(
            await alice.call_tool(
                "SendAgentMessage", {"to": "ttl-b", "message": {"kind": 1, "text": "x"}, "ttl_ms": 999}
            )
        )
        assert bad["code"] == "invalid_argument" and bad["violations"][0]["field"] == "ttl_ms"


async def test_with_max_deliveries_3_the_fourth_fetch_does_not_return_it(worker: Worker) -> None:
    async with worker.agent("poison-a") as alice, worker.agent("poison-b") as bob:
        poison = await send(alice, "poison-b", "crashes every reader")
        for _ in range(3):
            assert await fetch_ids(bob) == [poison["id"]]
        assert await fetch_ids(bob) == []
        (dead,) = await status(alice, poison["id"])
        assert (dead["state"], dead["reason"], dead["deliveries"]) == ("dead_lettered", "max_deliveries", 3)
        inspected = json.loads(run_relay("inspect", "poison-b", "--json", "--redis-url", worker.url).stdout)
        assert (inspected["agents"][0]["poisoned"], inspected["agents"][0]["expired"]) == (1, 0)
        assert sample(worker.process.metrics(), "csf_relay_inbox_poisoned", agent="poison-b") == 1
        listed = run_relay("dead-letters", "list", "poison-b", "--redis-url", worker.url).stdout
        assert poison["id"] in listed and "reason: max_deliveries" in listed
        requeued = run_relay("dead-letters", "requeue", "poison-b", "--json", "--redis-url", worker.url)
        (new_id,) = json.loads(requeued.stdout)["requeued"]
        assert await fetch_ids(bob) == [new_id]
        assert sample(worker.process.metrics(), "csf_relay_dead_letters_total", tier="host") >= 1


async def test_status_goes_queued_delivered_acknowledged_and_others_learn_nothing(worker: Worker) -> None:
    async with worker.agent("st-a") as alice, worker.agent("st-b") as bob, worker.agent("st-m") as mallory:
        sent = await send(alice, "st-b", "status me")
        (queued,) = await status(alice, sent["id"])
        assert queued == {
            "id": sent["id"],
            "state": "queued",
            "to": "st-b",
            "deliveries": 0,
            "sent_at": sent["sent_at"],
        }
        await fetch_ids(bob)
        (delivered,) = await status(alice, sent["id"])
        assert (delivered["state"], delivered["deliveries"]) == ("delivered", 1)
        data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": [sent["id"]]}))
        (acked,) = await status(alice, sent["id"])
        assert acked["state"] == "acknowledged" and acked["to"] == "st-b"
        for other in (mallory, bob):
            assert await status(other, sent["id"]) == [{"id": sent["id"], "state": "unknown"}]
        too_many = error(await alice.call_tool("GetMessageStatus", {"ids": [sent["id"]] * 257}))
        assert too_many["code"] == "invalid_argument"
