"""Long-polls over MCP against a real ``relay serve``: one agent parking 520 polls cannot make another
agent's poll fail (each parked poll holds no Redis connection; beyond its cap an agent gets a clear,
retryable ``too_many_waits`` at once), and stopping the worker answers parked polls at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import eventually
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, call_tool, ok, sample

ATTACK = 520
PER_AGENT = 16  # the default cap (RedisSettings.max_waits_per_agent)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[ServeProcess, Path]]:
    server = EmbeddedRedis()
    server.start()
    key = key_file(tmp_path)
    # 16 parked polls of one agent each hand out the same envelope: no poison limit here, that is
    # tests/test_delivery_mcp.py's subject
    args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key), "--max-deliveries", "0"]
    process = ServeProcess(args, tmp_path / "w.log")
    try:
        process.start()
        yield process, key
    finally:
        process.kill()
        server.stop()


def note(to: str) -> dict[str, object]:
    return {"to": to, "message": {"kind": 1, "text": f"to {to}"}}


def error_of(result: dict[str, object]) -> dict[str, object]:
    assert result.get("isError"), result
    content = result["content"]
    assert isinstance(content, list)
    return dict(json.loads(content[0]["text"])["error"])


async def test_520_parked_polls_of_one_agent_do_not_fail_another_agents_poll(
    worker: tuple[ServeProcess, Path],
) -> None:
    process, key = worker
    keyring = load_key_file(key)
    mallory, alice, bob = (agent_headers(keyring, a, f"{a}-1") for a in ("mallory", "alice", "bob"))
    limits = httpx2.Limits(max_connections=ATTACK + 50, max_keepalive_connections=ATTACK + 50)
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60), limits=limits) as http:
        for headers in (mallory, alice, bob):
            await ok(http, process.url, headers, "RegisterAgentAddress", REGISTER)
        started = time.monotonic()
        polls = [
            asyncio.create_task(call_tool(http, process.url, mallory, "FetchAgentInbox", {"wait_ms": 25000}))
            for _ in range(ATTACK)
        ]
        await eventually(
            lambda: sum(t.done() for t in polls) >= ATTACK - PER_AGENT,
            20,
            "every poll beyond the cap answered",
            interval=0.05,
        )
        refused = [t for t in polls if t.done()]
        assert len(refused) == ATTACK - PER_AGENT
        assert time.monotonic() - started < 20  # answered at once, not after the 25 s wait
        codes = Counter(error_of(t.result())["code"] for t in refused)
        assert codes == Counter({"too_many_waits": ATTACK - PER_AGENT})
        first = error_of(refused[0].result())
        assert first["retryable"] is True and first["cap"] == PER_AGENT and "16" in str(first["message"])
        assert sample(process.metrics(), "csf_relay_long_polls_parked") == PER_AGENT

        # another agent's poll parks and is woken by a send as usual
        poll = asyncio.create_task(ok(http, process.url, alice, "FetchAgentInbox", {"wait_ms": 3000}))
        sent = await ok(http, process.url, bob, "SendAgentMessage", note("alice"))
        assert [e["id"] for e in (await asyncio.wait_for(poll, 10))["envelopes"]] == [sent["id"]]

        # mallory's parked polls are woken by mail like any others
        to_mallory = await ok(http, process.url, bob, "SendAgentMessage", note("mallory"))
        for task in [t for t in polls if t not in refused]:
            woken = (await asyncio.wait_for(task, 10))["structuredContent"]["envelopes"]
            assert [e["id"] for e in woken] == [to_mallory["id"]]


async def test_stopping_the_worker_answers_parked_polls_at_once(worker: tuple[ServeProcess, Path]) -> None:
    process, key = worker
    bob = agent_headers(load_key_file(key), "bob", "bob-1")
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
        await ok(http, process.url, bob, "RegisterAgentAddress", REGISTER)
        poll = asyncio.create_task(call_tool(http, process.url, bob, "FetchAgentInbox", {"wait_ms": 25000}))
        for _ in range(200):
            if sample(await asyncio.to_thread(process.metrics), "csf_relay_long_polls_parked") >= 1:
                break
            await asyncio.sleep(0.05)
        started = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        result = await asyncio.wait_for(poll, 60)
        # answered at shutdown, far sooner than its 25 s wait (a margin no load eats)
        assert time.monotonic() - started < 12.5, "a parked poll held the shutdown up"
        assert result["structuredContent"]["envelopes"] == []
