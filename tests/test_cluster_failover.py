"""A cluster master dies under traffic: SIGKILL the master that serves an inbox's slot while one agent
sends to eight others over MCP through ``relay serve --wait-replicas 1``. Every send that returned an
id is fetched afterwards (the replica that was promoted holds it), and sends resume by themselves once
the replica is promoted; the outage window is printed (run with ``-s``) and in docs/reliability.md.

The cluster here has two replicas per master: after the failover the promoted replica still has a
replica of its own, so ``WAIT 1`` can be met again without an operator (with one replica per master,
sends to those slots would be refused until the old master rejoined as a replica)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.cluster_support import LocalCluster, find_cli
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, ok, tool_outcome

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_cli() is None, reason="redis-cli is not installed (apt-get install redis-tools)"),
]

RECIPIENTS = [f"r{i}" for i in range(8)]
KEYS = Keys()
SECONDS = 14.0
DURABLE = ("--wait-replicas", "1")


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(masters=3, replicas=2, node_timeout_ms=1000)
    local.start()
    try:
        yield local
    finally:
        local.stop()


async def test_a_killed_master_loses_no_acknowledged_send_and_sends_resume(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    victim = cluster.master_of(KEYS.inbox(RECIPIENTS[0]))
    entry = next(n for n in cluster.nodes if n is not victim and n.running)
    key = key_file(tmp_path)
    keyring = load_key_file(key)
    worker = ServeProcess(
        ["--redis-url", f"redis://127.0.0.1:{entry.port}", "--agent-mcp-key-file", str(key), *DURABLE],
        tmp_path / "worker.log",
    )
    worker.start()
    sender = agent_headers(keyring, "sender", "sender-1")
    accepted: dict[str, list[str]] = {r: [] for r in RECIPIENTS}
    timeline: list[tuple[float, str, str]] = []  # (time, recipient, ok|code)
    try:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
            for agent in ["sender", *RECIPIENTS]:
                await ok(
                    http,
                    worker.url,
                    agent_headers(keyring, agent, f"{agent}-1"),
                    "RegisterAgentAddress",
                    REGISTER,
                )
            started = time.monotonic()
            killed_at = None
            n = 0
            while time.monotonic() - started < SECONDS:
                if killed_at is None and time.monotonic() - started > 2.0:
                    victim.kill()  # SIGKILL by PID
                    killed_at = time.monotonic()
                to = RECIPIENTS[n % len(RECIPIENTS)]
                n += 1
                arguments = {"to": to, "message": {"kind": 1, "text": f"#{n}"}}
                outcome, data = await tool_outcome(http, worker.url, sender, "SendAgentMessage", arguments)
                now = time.monotonic()
                if outcome == "ok":
                    accepted[to].append(str(data["id"]))
                    timeline.append((now, to, "ok"))
                else:
                    assert outcome == "error" and data["code"] == "backend_unavailable", data
                    assert data["retryable"] is True
                    timeline.append((now, to, str(data["code"])))
                    await asyncio.sleep(0.05)
            assert killed_at is not None
            victim_slots = [r for r in RECIPIENTS if r == RECIPIENTS[0] or _same_master(cluster, r, victim)]
            failures = [t for t, r, what in timeline if what != "ok" and t >= killed_at]
            resumed = [t for t, r, what in timeline if what == "ok" and t >= killed_at and r in victim_slots]
            assert resumed, "sends to the failed master's slots never resumed"
            after_outage = [t for t in resumed if not failures or t > max(failures)]
            assert after_outage, "sends still failing at the end"
            window = (max(failures) - killed_at) if failures else 0.0
            print(
                f"\nfailover: {len(failures)} sends refused (backend_unavailable, retryable) within "
                f"{window:.2f} s of the SIGKILL; {sum(map(len, accepted.values()))} accepted"
            )
            # every accepted send is there, fetched through the promoted replica
            for recipient in RECIPIENTS:
                headers = agent_headers(keyring, recipient, f"{recipient}-1")
                got: list[str] = []
                for _ in range(100):
                    page = (await ok(http, worker.url, headers, "FetchAgentInbox", {"limit": 256}))[
                        "envelopes"
                    ]
                    if not page:
                        break
                    got += [e["id"] for e in page]
                    await ok(
                        http, worker.url, headers, "AcknowledgeAgentInbox", {"ids": [e["id"] for e in page]}
                    )
                missing = set(accepted[recipient]) - set(got)
                assert not missing, (recipient, sorted(missing))
    finally:
        worker.stop()


def _same_master(cluster: LocalCluster, recipient: str, victim: object) -> bool:
    try:
        return cluster.master_of(KEYS.inbox(recipient)) is victim
    except RuntimeError:
        return False
