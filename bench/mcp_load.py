"""One MCP client process of the benchmark: a few agents driving relay workers with the official client.

Started by ``bench/run.py`` (one or more at once, so client CPU is spread over processes, as real agents
would be). Protocol on stdin/stdout, one JSON object per line:

1. argv[1] is the job: ``{"agents": [[name, url, partner], ...], "key_file": ..., "mode": "auto"|"legacy",
   "run": tag}``.
2. The process connects every agent, registers it and warms up, then prints ``{"ready": true}``.
3. Each line ``relay SECONDS`` or ``noop SECONDS`` on stdin runs that phase and prints its result;
   ``quit`` (or end of input) ends the process.

Phase ``relay``: each agent sends 16 messages to its partner (one ``SendAgentMessage`` each), then
fetches its own inbox (``FetchAgentInbox`` limit 16) and acknowledges what it got in one
``AcknowledgeAgentInbox``; after the deadline every agent drains its inbox until it has everything its
partner sent. Every text carries a unique id, so losses and duplicates are counted per message.
Phase ``noop``: each agent calls the bench-only ``NoOp`` tool in a loop (the ceiling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers

BATCH = 16
TEXT_BYTES = 300
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


def message_text(uid: str) -> str:
    head = f"bench {uid} "
    return head + "x" * (TEXT_BYTES - len(head))


def uid_of(text: str) -> str:
    return text.split(" ", 2)[1]


@dataclass
class Tally:
    deadline: float = float("inf")
    """End of the measured window: rates count only what completed by then (see ``phase``)."""
    window_calls: int = 0
    calls: int = 0
    call_latency: list[float] = field(default_factory=list)
    msg_latency: list[float] = field(default_factory=list)
    sent: int = 0
    send_failed: int = 0
    acked: int = 0
    duplicated: int = 0
    errors: list[str] = field(default_factory=list)


class Agent:
    def __init__(self, name: str, url: str, partner: str, keyring: Any, mode: str, run: str) -> None:
        self.name = name
        self.url = url
        self.partner = partner
        self.mode = mode
        self.session = f"{run}-{name}"
        self.headers = agent_headers(keyring, name, self.session, 3600)
        self.client: Client | None = None
        self.sent_to_partner = 0
        self.received: set[str] = set()

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        http = httpx2.AsyncClient(headers=self.headers, timeout=httpx2.Timeout(30, read=60))
        await stack.enter_async_context(http)
        self.client = await stack.enter_async_context(
            Client(streamable_http_client(self.url, http_client=http), mode=self.mode)
        )

    async def call(self, tally: Tally, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None
        t0 = time.perf_counter()
        result = await self.client.call_tool(tool, args)
        now = time.perf_counter()
        tally.call_latency.append(now - t0)
        tally.calls += 1
        if now <= tally.deadline:
            tally.window_calls += 1
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result.content[0].text if result.content else result}")
        data = result.structured_content
        if not isinstance(data, dict):
            raise RuntimeError(f"{tool} returned no structured content")
        return data


async def relay_agent(
    agent: Agent,
    tally: Tally,
    deadline: float,
    sent_at: dict[str, float],
    acked: set[str],
    expected: dict[str, int],
    done_sending: asyncio.Event,
    senders_left: list[int],
    seq: list[int],
) -> None:
    async def fetch_and_ack() -> int:
        got = await agent.call(tally, "FetchAgentInbox", {"limit": BATCH})
        envelopes = got["envelopes"]
        if not envelopes:
            return 0
        ids = []
        uids = []
        for envelope in envelopes:
            uid = uid_of(envelope["message"]["text"])
            if uid in acked:
                tally.duplicated += 1
            ids.append(envelope["id"])
            uids.append(uid)
        done = await agent.call(tally, "AcknowledgeAgentInbox", {"ids": ids})
        now = time.perf_counter()
        ok = set(done["acknowledged"])
        for envelope_id, uid in zip(ids, uids, strict=True):
            if envelope_id not in ok:
                continue
            if uid in acked:
                tally.duplicated += 1
                continue
            acked.add(uid)
            agent.received.add(uid)
            tally.acked += 1
            tally.msg_latency.append(now - sent_at[uid])
        return len(envelopes)

    while time.perf_counter() < deadline:
        for _ in range(BATCH):
            seq[0] += 1
            uid = f"{agent.name}.{seq[0]:x}"
            sent_at[uid] = time.perf_counter()
            try:
                message = {"kind": 1, "text": message_text(uid)}
                await agent.call(tally, "SendAgentMessage", {"to": agent.partner, "message": message})
            except RuntimeError as exc:
                tally.send_failed += 1
                tally.errors.append(str(exc)[:200])
                continue
            tally.sent += 1
            expected[agent.partner] = expected.get(agent.partner, 0) + 1
        await fetch_and_ack()
    senders_left[0] -= 1
    if senders_left[0] == 0:
        done_sending.set()
    await done_sending.wait()
    drain_until = time.perf_counter() + 20
    while len(agent.received) < expected.get(agent.name, 0) and time.perf_counter() < drain_until:
        if not await fetch_and_ack():
            await asyncio.sleep(0.005)


async def noop_agent(agent: Agent, tally: Tally, deadline: float) -> None:
    while time.perf_counter() < deadline:
        await agent.call(tally, "NoOp", {})


async def phase(agents: list[Agent], name: str, duration: float, state: dict[str, Any]) -> dict[str, Any]:
    """Run one phase. Call rates are taken over the window ``[start, start + duration]`` (calls
    completed in it), the same for relay and NoOp: what follows the deadline (the agents' last cycles,
    then draining every inbox for the exactly-once check) winds down at a falling rate and would bias
    the phase with the longer tail. It still counts for CPU, messages, lost and duplicated."""
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + duration
    tally = Tally(deadline=deadline)
    if name == "noop":
        await asyncio.gather(*(noop_agent(a, tally, deadline) for a in agents))
    else:
        done_sending = asyncio.Event()
        left = [len(agents)]
        expected: dict[str, int] = {}
        sent_at, acked, seq = state["sent_at"], state["acked"], state["seq"]
        shared = (sent_at, acked, expected, done_sending, left, seq)
        await asyncio.gather(*(relay_agent(a, tally, deadline, *shared) for a in agents))
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    return {
        "elapsed": elapsed,
        "window": duration,
        "window_calls": tally.window_calls,
        "cpu": cpu,
        "calls": tally.calls,
        "call_latency": tally.call_latency,
        "msg_latency": tally.msg_latency,
        "sent": tally.sent,
        "send_failed": tally.send_failed,
        "acked": tally.acked,
        "duplicated": tally.duplicated,
        "errors": tally.errors[:5],
    }


async def main(job: dict[str, Any]) -> None:
    keyring = load_key_file(job["key_file"])
    agents = [Agent(n, u, p, keyring, job["mode"], job["run"]) for n, u, p in job["agents"]]
    state: dict[str, Any] = {"sent_at": {}, "acked": set(), "seq": [0]}
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            await agent.open(stack)
        warm = Tally()
        for agent in agents:
            await agent.call(warm, "RegisterAgentAddress", REGISTER)
        for agent in agents:  # warm-up: connections, discovery, caches, first validation
            await agent.call(warm, "NoOp", {})
            await agent.call(warm, "FetchAgentInbox", {"limit": BATCH})
        print(json.dumps({"ready": True}), flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                return
            for agent in agents:
                agent.received.clear()
            result = await phase(agents, words[0], float(words[1]), state)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(main(json.loads(sys.argv[1])))
