"""Load: 50 concurrent agents x 200 messages through two ``relay serve`` workers on one Redis.

Every agent sends 200 notes (spread over the other 49 agents, so each also receives exactly 200)
while it fetches and acknowledges its own inbox, all at once. Sends go to one worker, fetches to the
other, acknowledgements to the first again: the consumer is the same on every worker. Plain JSON-RPC
POSTs (stateless MCP) keep the client cheap. Checked: zero lost, zero duplicated, nothing acknowledged
comes back, every inbox empty at the end. The figures are printed (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
import redis.asyncio as aioredis

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.fault_support import check_envelope, check_stored_entries
from tests.front_support import key_file
from tests.processes import REGISTER, ok, serve_processes, tool_outcome

AGENTS = 50
MESSAGES = 200
STALL_SECONDS = 90.0
"""The run fails when no send and no acknowledgement lands for this long: a stall, not slowness. A
loaded machine makes the run slower (about 60 s quiet, several times that under load), so the test
bounds the time without progress instead of the total time; pytest's timeout is the backstop."""


@dataclass
class Agent:
    name: str
    index: int
    headers: dict[str, str]
    sent: dict[str, str] = field(default_factory=dict)  # text -> id
    send_latency: list[float] = field(default_factory=list)
    received: dict[str, str] = field(default_factory=dict)  # id -> text
    acknowledged: set[str] = field(default_factory=set)
    came_back: list[str] = field(default_factory=list)
    fetches: int = 0
    acks: int = 0
    errors: Counter[str] = field(default_factory=Counter)


def recipient(sender: int, number: int) -> int:
    return (sender + 1 + number % (AGENTS - 1)) % AGENTS


async def send_all(http: httpx2.AsyncClient, urls: list[str], agents: list[Agent], me: Agent) -> None:
    url = urls[me.index % 2]
    for number in range(1, MESSAGES + 1):
        text = f"from {me.name} #{number}"
        to = agents[recipient(me.index, number)].name
        started = time.monotonic()
        outcome, data = await tool_outcome(
            http, url, me.headers, "SendAgentMessage", {"to": to, "message": {"kind": 1, "text": text}}
        )
        me.send_latency.append(time.monotonic() - started)
        if outcome != "ok":
            me.errors[data.get("code") or data["exception"]] += 1
            continue
        me.sent[text] = data["id"]


async def receive_all(http: httpx2.AsyncClient, urls: list[str], me: Agent) -> None:
    fetch_url, ack_url = urls[(me.index + 1) % 2], urls[me.index % 2]
    for _ in range(100_000):  # bounded in count; until_done fails a stall
        if len(me.acknowledged) >= MESSAGES:
            return
        outcome, data = await tool_outcome(
            http, fetch_url, me.headers, "FetchAgentInbox", {"limit": 64, "wait_ms": 1000}
        )
        me.fetches += 1
        if outcome != "ok":
            me.errors[data.get("code") or data["exception"]] += 1
            continue
        ids = []
        for envelope in data["envelopes"]:
            check_envelope(envelope)
            if envelope["id"] in me.acknowledged:
                me.came_back.append(envelope["id"])
            me.received[envelope["id"]] = envelope["message"]["text"]
            ids.append(envelope["id"])
        if ids:
            outcome, done = await tool_outcome(
                http, ack_url, me.headers, "AcknowledgeAgentInbox", {"ids": ids}
            )
            me.acks += 1
            if outcome != "ok":
                me.errors[done.get("code") or done["exception"]] += 1
                continue
            me.acknowledged.update(done["acknowledged"])
            assert not done["unknown"], done


async def until_done(tasks: list[asyncio.Task[None]], agents: list[Agent], logs: list[Path]) -> None:
    """Await ``tasks``; fail naming the stall when nothing was sent or acknowledged for STALL_SECONDS."""
    pending = set(tasks)
    progress, last = -1, time.monotonic()
    for _ in range(1_000_000):  # bounded; each round waits up to a second
        if not pending:
            return
        done, pending = await asyncio.wait(pending, timeout=1.0)
        for task in done:
            task.result()  # a failed task fails the test with its own error
        now = sum(len(a.sent) + len(a.acknowledged) + sum(a.errors.values()) for a in agents)
        if now != progress:
            progress, last = now, time.monotonic()
        elif time.monotonic() - last >= STALL_SECONDS:
            behind = {
                a.name: (len(a.sent), len(a.acknowledged)) for a in agents if len(a.acknowledged) < MESSAGES
            }
            errors = sum((a.errors for a in agents), Counter())
            raise AssertionError(
                f"stalled: no send or acknowledgement for {STALL_SECONDS} s; (sent, acknowledged) of the"
                f" agents not done: {behind}; errors: {dict(errors)}; workers' warnings:\n{warnings(logs)}"
            )
    raise AssertionError("not done within a million rounds")


def warnings(logs: list[Path]) -> str:
    """The workers' log lines above INFO, at most 40."""
    lines = [line for log in logs for line in log.read_text().splitlines() if " INFO " not in line]
    return "\n".join(lines[:40])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_fifty_agents_two_hundred_messages_each_through_two_workers(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="everysec")  # what `relay serve` runs
    server.start()
    key = key_file(tmp_path)
    keyring = load_key_file(key)
    store = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        args = ["--redis-url", server.url, "--agent-mcp-key-file", str(key)]
        with serve_processes(tmp_path, 2, *args) as pair:
            urls = [w.url for w in pair]
            limits = httpx2.Limits(max_connections=4 * AGENTS, max_keepalive_connections=4 * AGENTS)
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(60), limits=limits) as http:
                agents = [
                    Agent(f"agent-{i:02d}", i, agent_headers(keyring, f"agent-{i:02d}", "load"))
                    for i in range(AGENTS)
                ]
                for agent in agents:
                    await ok(http, urls[agent.index % 2], agent.headers, "RegisterAgentAddress", REGISTER)
                cpu_before = [cpu_seconds(w.pid) for w in pair], time.process_time()
                started = time.monotonic()
                receiving = [asyncio.create_task(receive_all(http, urls, a)) for a in agents]
                sending = [asyncio.create_task(send_all(http, urls, agents, a)) for a in agents]
                try:
                    await until_done(sending, agents, [w.log for w in pair])
                    sent_in = time.monotonic() - started
                    await until_done(receiving, agents, [w.log for w in pair])
                    done_in = time.monotonic() - started
                    worker_cpu = sum(cpu_seconds(w.pid) for w in pair) - sum(cpu_before[0])
                    client_cpu = time.process_time() - cpu_before[1]
                finally:
                    for task in [*sending, *receiving]:
                        task.cancel()
                    await asyncio.gather(*sending, *receiving, return_exceptions=True)
                for agent in agents:
                    left = await ok(http, urls[0], agent.headers, "FetchAgentInbox", {"limit": 256})
                    assert left["envelopes"] == [], agent.name
            backlog = sum([await store.xlen(f"relay:inbox:{{{a.name}}}") for a in agents])
            entries = await check_stored_entries(store, "relay:inbox:*")
            logs = "".join(w.log.read_text() for w in pair)
    finally:
        await store.aclose()
        server.stop()

    sent = {text: envelope_id for a in agents for text, envelope_id in a.sent.items()}
    received: Counter[str] = Counter(text for a in agents for text in a.received.values())
    delivered_to = {text: a.name for a in agents for text in a.received.values()}
    misdelivered = [
        text
        for text in delivered_to
        if delivered_to[text] != agents[recipient(int(text.split()[1][6:]), int(text.split("#")[1]))].name
    ]
    latency = [x for a in agents for x in a.send_latency]
    figures = {
        "agents": AGENTS,
        "messages_per_agent": MESSAGES,
        "sent_ok": len(sent),
        "received": sum(received.values()),
        "lost": sum(1 for text in sent if text not in received),
        "duplicated": sum(n - 1 for n in received.values()),
        "came_back_after_ack": sum(len(a.came_back) for a in agents),
        "misdelivered": len(misdelivered),
        "errors": dict(sum((a.errors for a in agents), Counter())),
        "fetch_calls": sum(a.fetches for a in agents),
        "sends_done_s": round(sent_in, 2),
        "all_acked_s": round(done_in, 2),
        "sends_per_s": round(len(sent) / sent_in, 1),
        "end_to_end_msgs_per_s": round(len(sent) / done_in, 1),
        "send_latency_ms_p50": round(statistics.median(latency) * 1000, 1),
        "send_latency_ms_p99": round(percentile(latency, 0.99) * 1000, 1),
        "workers_cpu_s": round(worker_cpu, 1),
        "client_cpu_s": round(client_cpu, 1),
        "tool_calls": len(sent) + sum(a.fetches + a.acks for a in agents),
        "backlog_after": backlog,
        "stream_entries_after": entries,
    }
    print(f"\nload: {json.dumps(figures)}")
    assert figures["errors"] == {}
    assert len(sent) == AGENTS * MESSAGES
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["came_back_after_ack"] == 0
    assert figures["misdelivered"] == 0
    assert all(len(a.acknowledged) == MESSAGES for a in agents)
    assert backlog == 0 and entries == 0
    assert "Traceback" not in logs
