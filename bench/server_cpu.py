"""Server CPU per message over MCP, one message at a time (``bench/run.py``: ``server_cpu_ms_per_msg``).

8 JSON-RPC clients (``httpx2``, the requests the official SDK sends: ``bench/network.py``'s ``_call``),
each its own agent on one of the bench's ``relay serve`` workers (agent k on worker k mod n), each a
loop of ``SendAgentMessage`` to itself -> ``FetchAgentInbox`` (limit 1) -> ``AcknowledgeAgentInbox``
of what it got. Per message: the workers' process CPU (``/proc``) plus Redis's
``used_cpu_sys + used_cpu_user`` (``INFO``) over the phase, divided by the messages acknowledged; the
clients run in the bench process and are not counted. Rounds: the median round.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx2

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers

CLIENTS = 8


async def server_cpu_figures(
    workers: Any, key_file: Path, monitor: Any, redis_cpu: Any, rounds: int, duration: float
) -> dict[str, Any]:
    """``server_cpu_ms_per_msg`` and its parts, ``lost`` and ``duplicated`` for the phase."""
    from network import _call  # bench/network.py: bench/ is on the path

    keyring = load_key_file(key_file)
    run = f"{time.time_ns() % 10**9}"
    agents = []
    async with httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=CLIENTS * 2)) as http:
        for k in range(CLIENTS):
            name = f"cpu{run}-{k}"
            headers = agent_headers(keyring, name, "s1", 3600)
            url = workers.urls[k % len(workers.urls)] + "/mcp/agent"
            address = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
            await _call(http, url, headers, "RegisterAgentAddress", address)
            agents.append((name, url, headers))
        sent: set[str] = set()
        acked: set[str] = set()
        duplicated = 0

        seqs = dict.fromkeys((a[0] for a in agents), 0)

        async def loop(name: str, url: str, headers: dict[str, str], end: float) -> int:
            nonlocal duplicated
            done = 0
            while time.perf_counter() < end:
                seqs[name] += 1
                uid = f"{name}.{seqs[name]}"
                sent.add(uid)
                message = {"to": name, "message": {"kind": 1, "text": f"bench {uid} " + "x" * 280}}
                await _call(http, url, headers, "SendAgentMessage", message)
                got = await _call(http, url, headers, "FetchAgentInbox", {"limit": 1})
                ids = [e["id"] for e in got["envelopes"]]
                if ids:
                    answer = await _call(http, url, headers, "AcknowledgeAgentInbox", {"ids": ids})
                    ok = set(answer.get("acknowledged", ids))
                    for envelope in got["envelopes"]:
                        uid_got = envelope["message"]["text"].split(" ", 2)[1]
                        if uid_got in acked:
                            duplicated += 1
                        elif envelope["id"] in ok:
                            acked.add(uid_got)
                            done += 1
            return done

        async def drain(name: str, url: str, headers: dict[str, str]) -> None:
            for _ in range(100):
                got = await _call(http, url, headers, "FetchAgentInbox", {"limit": 16})
                if not got["envelopes"]:
                    return
                ids = {"ids": [e["id"] for e in got["envelopes"]]}
                await _call(http, url, headers, "AcknowledgeAgentInbox", ids)
                for envelope in got["envelopes"]:
                    acked.add(envelope["message"]["text"].split(" ", 2)[1])

        per_round: list[tuple[float, float, float, float]] = []
        calls: dict[str, int] = {}
        for _ in range(rounds):
            stats0 = await monitor.info("commandstats")
            redis0, workers0 = await redis_cpu(monitor), workers.cpu()
            began = time.perf_counter()
            counts = await asyncio.gather(*(loop(*a, began + duration) for a in agents))
            elapsed = time.perf_counter() - began
            worker_s, redis_s = workers.cpu() - workers0, await redis_cpu(monitor) - redis0
            messages = sum(counts)
            stats = await monitor.info("commandstats")
            for name, row in stats.items():
                calls[name] = (
                    calls.get(name, 0) + int(row["calls"]) - int(stats0.get(name, {}).get("calls", 0))
                )
            if messages:
                per_round.append((worker_s / messages, redis_s / messages, messages / elapsed, elapsed))
            await asyncio.gather(*(drain(*a) for a in agents))
    worker_us = median([r[0] for r in per_round]) * 1e6
    redis_us = median([r[1] for r in per_round]) * 1e6
    total_ms = median([r[0] + r[1] for r in per_round]) * 1e3
    rate = median([r[2] for r in per_round])
    total = sum(round(r[2] * r[3]) for r in per_round)
    scripts = calls.get("cmdstat_fcall", 0) / max(total, 1)
    commands = sum(calls.values()) / max(total, 1)  # a script's own commands are counted too (Redis 7)
    print(
        f"MCP one at a time, {CLIENTS} JSON-RPC clients on {len(workers.urls)} workers: {rate:.0f} msgs/s, "
        f"server CPU {total_ms:.2f} ms per message (workers {worker_us:.0f} µs, Redis {redis_us:.0f} µs; "
        f"rounds: {', '.join(f'{(r[0] + r[1]) * 1e3:.2f}' for r in per_round)}); per message {scripts:.1f} "
        f"script calls, {commands:.1f} Redis commands in all",
        flush=True,
    )
    return {
        "server_cpu_ms_per_msg": round(total_ms, 2),
        "server_worker_us_per_msg": round(worker_us),
        "server_redis_us_per_msg": round(redis_us),
        "server_msgs_per_s": round(rate),
        "server_lost": len(sent - acked),
        "server_duplicated": duplicated,
    }
