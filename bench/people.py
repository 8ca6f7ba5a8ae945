"""``relay agents`` at scale: 1,000 registered agents and 100,000 queued envelopes (docs/shell.md).

    python bench/people.py      # about a minute; bench/run.py runs it too (--skip-people skips it)

On a Redis of its own: registers the agents, queues the envelopes (100 per agent, through the relay's
own send), hands some out (so ``pending`` is not 0), then times ``relay agents --json`` as a child
process, the way a person runs it (start-up included; ``agents_cli_ms`` wall and ``agents_cli_cpu_ms``
CPU, medians of 3), and the query behind it in this process (``agents_query_ms``, median of 3).
Neither reads an envelope: per agent one read-only script reads XLEN, the XPENDING summary and the
oldest entry id.

The last line starts with ``people-bench``.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.operator_view import RedisOperatorView
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.relay import Relay

AGENTS = 1000
ENVELOPES = 100_000
IN_FLIGHT = 512
ROOT = Path(__file__).resolve().parents[1]


async def populate(url: str, agents: int = AGENTS, envelopes: int = ENVELOPES) -> None:
    connection = RedisConnection(RedisSettings(url=url))
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    names = [f"agent-{i:04d}" for i in range(agents)]
    address = ClaudeCodeAddress.parse("127.0.0.1:14111")
    body = AgentMessage(kind=Kind.KIND_NOTE, text="x" * 200)
    async with relay:
        await asyncio.gather(*(relay.register(n, address, "s-1") for n in names))
        for start in range(0, envelopes, IN_FLIGHT):
            await asyncio.gather(
                *(
                    relay.send(names[(k + 1) % agents], names[k % agents], body)
                    for k in range(start, min(start + IN_FLIGHT, envelopes))
                )
            )
        await asyncio.gather(*(relay.fetch(n, 10) for n in names[: agents // 10]))


async def query_ms(url: str) -> tuple[float, int]:
    view = RedisOperatorView(RedisConnection(RedisSettings(url=url)))
    await view.open()
    try:
        started = time.perf_counter()
        page = await view.agents(AGENTS * 10)
        return (time.perf_counter() - started) * 1000, sum(a.inbox_depth for a in page.agents)
    finally:
        await view.close()


def cli_ms(url: str) -> tuple[float, float, int]:
    """Wall and CPU (user + system) milliseconds of one ``relay agents --json``, and the agents it
    listed. CPU time is the steadier figure on a busy machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(RELAY_REDIS_URL=url, PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "relay", "agents", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    elapsed = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return elapsed, cpu, len(json.loads(done.stdout)["agents"])


async def bench_agents() -> dict[str, Any]:
    """The ``relay agents`` figures, on a Redis started (and stopped) for them."""
    with tempfile.TemporaryDirectory(prefix="relay-people-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        server.start()
        try:
            started = time.perf_counter()
            await populate(server.url)
            filled = time.perf_counter() - started
            queries = [await query_ms(server.url) for _ in range(3)]
            runs = [cli_ms(server.url) for _ in range(3)]
        finally:
            server.stop()
    assert all(total == ENVELOPES for _, total in queries), queries
    assert all(count == AGENTS for *_, count in runs), runs
    print(
        f"relay agents with {AGENTS} agents and {ENVELOPES} queued envelopes (filled in {filled:.1f} s): "
        f"query {', '.join(f'{q:.0f}' for q, _ in queries)} ms; command, process start-up included: "
        f"{', '.join(f'{w:.0f}' for w, _, _ in runs)} ms wall, {', '.join(f'{c:.0f}' for _, c, _ in runs)} "
        f"ms CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    return {
        "agents_cli_ms": round(statistics.median(w for w, _, _ in runs)),
        "agents_cli_cpu_ms": round(statistics.median(c for _, c, _ in runs)),
        "agents_query_ms": round(statistics.median(q for q, _ in queries)),
    }


def main() -> int:
    figures = asyncio.run(bench_agents())
    print("people-bench " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
