"""The per-agent send rate limit over MCP, shared by two ``relay serve`` workers through one Redis.

The token bucket itself (``lua/send.lua``, key ``relay:rate:{agent}``) is covered at the relay level by
``broker.testing.conformance`` (``test_send_rate_is_limited_per_agent_across_relays``). Here: what an
agent sees through the tool (``rate_limited``, retryable, with ``retry_after``), that the bucket is one
for both workers, that it is per agent, that a refused send stores nothing, and that waiting
``retry_after`` is enough: nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2
import pytest
import redis.asyncio as aioredis

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.front_support import key_file
from tests.processes import REGISTER, ok, serve_processes, tool_outcome

RATE = 0.5  # sends per second: one token every 2 s
BURST = 4


@pytest.mark.slow
async def test_excess_sends_get_rate_limited_with_retry_after_and_nothing_is_dropped(tmp_path: Path) -> None:
    server = EmbeddedRedis()
    server.start()
    key = key_file(tmp_path)
    keyring = load_key_file(key)
    alice, bob = agent_headers(keyring, "alice", "a-1"), agent_headers(keyring, "bob", "b-1")
    args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key)]
    args += ["--send-rate", str(RATE), "--send-burst", str(BURST)]
    try:
        with serve_processes(tmp_path, 2, *args) as pair:
            urls = [w.url for w in pair]
            async with httpx2.AsyncClient(timeout=30) as http:
                await ok(http, urls[0], alice, "RegisterAgentAddress", REGISTER)
                await ok(http, urls[1], bob, "RegisterAgentAddress", REGISTER)
                accepted: list[str] = []
                refusals: list[dict[str, object]] = []
                started = time.monotonic()
                # alternate the two workers until the first refusal
                for attempt in range(4 * BURST):
                    message = {"to": "bob", "message": {"kind": 1, "text": f"#{attempt}"}}
                    outcome, data = await tool_outcome(
                        http, urls[attempt % 2], alice, "SendAgentMessage", message
                    )
                    if outcome == "error":
                        refusals.append(data)
                        break
                    assert outcome == "ok", data
                    accepted.append(data["id"])
                elapsed = time.monotonic() - started
                (refused,) = refusals
                assert refused["code"] == "rate_limited" and refused["retryable"] is True, refused
                assert refused["agent"] == "alice" and "retry after" in str(refused["message"])
                retry_after = float(str(refused["retry_after"]))
                assert 0 < retry_after <= 1 / RATE + 0.01, refused
                # the bucket is shared: both workers together allowed the burst (plus any refill), not
                # a burst each
                assert BURST <= len(accepted) <= BURST + int(elapsed * RATE) + 1 < 2 * BURST, (
                    accepted,
                    elapsed,
                )

                # another agent has its own bucket
                await ok(
                    http,
                    urls[0],
                    bob,
                    "SendAgentMessage",
                    {"to": "alice", "message": {"kind": 1, "text": "hi"}},
                )

                # a client that waits retry_after gets through; every refusal along the way says how long
                retried = 0
                for _ in range(10):
                    await asyncio.sleep(retry_after)
                    message = {"to": "bob", "message": {"kind": 1, "text": "after waiting"}}
                    outcome, data = await tool_outcome(
                        http, urls[retried % 2], alice, "SendAgentMessage", message
                    )
                    retried += 1
                    if outcome == "ok":
                        accepted.append(data["id"])
                        break
                    assert data["code"] == "rate_limited", data
                    retry_after = float(data["retry_after"])
                else:
                    raise AssertionError("a send that waited retry_after never got through")

                # exactly the accepted sends are in bob's inbox: refused ones stored nothing
                inbox = await ok(http, urls[1], bob, "FetchAgentInbox", {"limit": 256})
                assert [e["id"] for e in inbox["envelopes"]] == accepted
                async with aioredis.Redis.from_url(server.url, decode_responses=True) as store:
                    bucket = await store.hgetall("relay:rate:{alice}")
                    assert set(bucket) == {"tokens", "ts"}
                    assert 0 < await store.pttl("relay:rate:{alice}") <= (BURST / RATE + 1) * 1000
                    assert await store.xlen("relay:inbox:{bob}") == len(accepted)
        print(
            f"\nrate limit over MCP ({RATE}/s, burst {BURST}, two workers): {len(accepted) - 1} accepted "
            f"in {elapsed:.2f} s before the first refusal (retry_after {refused['retry_after']} s); "
            f"through again after {retried} wait(s)"
        )
    finally:
        server.stop()
