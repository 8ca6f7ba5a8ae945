"""The Workbench tier: prompt latency with 8 live SDK sessions, their idle memory, and nothing lost when
session processes are killed. Called from ``bench/run.py`` (``workbench_figures``); runnable alone::

    python bench/workbench.py [--samples 200]

``relay.workbench.host`` (the code ``relay workbench`` runs) hosts 4 Copilot SDK and 4 Claude Agent SDK
sessions on the bench's Redis, their models the tests' fake APIs on loopback (answering at once), in a
process of their own as a model API is (``bench/model_apis.py``).

- ``workbench_prompt_p50_ms`` / ``_p99_ms``: one envelope at a time, round robin over the 8 agents, each
  to a session that accepted its last prompt and has ended that turn (a turn's length is the model's
  and the SDK's, not relay's), from the call of ``Relay.send`` (the envelope is appended during it)
  to the host handing the prompt to its session (``WorkbenchSessions.submit``, which calls the SDK's
  send at once). The
  sender is a process of its own (``--sender``), as the agents that write to Workbench agents are: a
  send made on the host's own loop would wait out the SDKs' work there before it appends, a wait no
  real sender has. Both processes read the same monotonic clock.
- ``workbench_loop_lag_p99_ms``: how late the host's event loop ran a 10 ms timer meanwhile (the SDKs'
  reader threads share the process and its GIL): what the latency cannot go below.
- ``workbench_rss_copilot_mib`` / ``_claude_agent_mib``: RSS of one idle session's CLI process tree,
  the mean over that runtime's sessions, once the latency phase is over.
- ``workbench_lost``: 16 envelopes to one session of each runtime, its CLI SIGKILLed after the 4th was
  accepted; envelopes whose prompt never reached the model once every envelope was acknowledged (which
  a session's envelope is once its model answered the prompt) or the bound (120 s) passed. 0 is the
  only good figure.

Needs the agent SDKs and the Copilot CLI (``scripts/install-agent-sdks``); skipped, saying so, without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adapters.workbench.runtime import WorkbenchSessions  # noqa: E402
from bench.model_apis import ModelAPIs  # noqa: E402
from broker.addresses import ClaudeCodeAddress  # noqa: E402
from broker.agent_message import AgentMessage, Kind  # noqa: E402
from broker.delivery import DeliverySettings  # noqa: E402
from broker.relay import Relay  # noqa: E402
from relay.workbench import delivery_settings, host, messenger_on  # noqa: E402
from relay.workbench_config import load  # noqa: E402
from tests.workbench_support import (  # noqa: E402
    COPILOT_CACHE,
    COPILOT_CLI,
    KEYS,
    claude_agent_entry,
    copilot_agent_entry,
    write_config,
)

PER_RUNTIME = 4
KILL_ENVELOPES = 16
KILL_AFTER = 4
BOUND = 120.0
_ID = re.compile(r"\A\[relay\] message (env_[0-9A-Z]{26}) for ")


class TimedSessions(WorkbenchSessions):
    """``WorkbenchSessions`` that notes when each envelope's prompt is handed to its session, and
    which prompts the sessions accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: dict[str, float] = {}
        self.accepted: set[str] = set()
        self.changed = asyncio.Event()

    async def submit(self, session: str, prompt: str) -> None:
        found = _ID.match(prompt)
        if found and found.group(1) not in self.handed:
            self.handed[found.group(1)] = time.perf_counter()
            self.changed.set()
        await super().submit(session, prompt)
        if found:
            self.accepted.add(found.group(1))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mib(pid: int) -> float:
    """RSS of ``pid`` and every process below it, MiB."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                tree.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        each = todo.pop()
        todo += tree.get(each, [])
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


async def _until(condition: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return bool(condition())


async def workbench_figures(redis_url: str, *, samples: int = 200) -> dict[str, Any]:
    """The figures as a dict; ``{}`` (and a line saying why) where the SDKs are not installed."""
    missing = [m for m in ("copilot", "claude_agent_sdk") if importlib.util.find_spec(m) is None]
    if missing or not COPILOT_CLI.exists():
        print(f"workbench: skipped ({missing or COPILOT_CLI} missing; run scripts/install-agent-sdks)")
        return {}
    os.environ["XDG_CACHE_HOME"] = str(COPILOT_CACHE)
    tmp = Path(tempfile.mkdtemp(prefix="relay-workbench-bench-"))
    prefix = f"relay-bench-wb-{secrets.token_hex(3)}"
    try:
        with ModelAPIs() as apis:
            copilots = [f"copilot-{i}" for i in range(PER_RUNTIME)]
            claudes = [f"claude-{i}" for i in range(PER_RUNTIME)]
            entries = [copilot_agent_entry(a, apis.openai, COPILOT_CLI) for a in copilots]
            entries += [claude_agent_entry(a, apis.anthropic) for a in claudes]
            config = write_config(tmp / "workbench.toml", entries, visibility_seconds=10)
            loaded = load(config, {**os.environ, **KEYS})
            sessions = TimedSessions()
            stop, ready = asyncio.Event(), asyncio.Event()
            hosting = asyncio.create_task(
                host(
                    loaded, redis_url, tmp / "data", stop=stop, prefix=prefix, sessions=sessions, ready=ready
                )
            )
            async with messenger_on(redis_url, delivery_settings(loaded), prefix=prefix) as messenger:
                relay = messenger.relay
                try:
                    if not await _until(lambda: ready.is_set() or hosting.done(), 180):
                        raise RuntimeError("the sessions did not open in 180 s")
                    if hosting.done():
                        hosting.result()
                    await relay.register("bench", ClaudeCodeAddress.parse("127.0.0.1:14111"), "bench-1")
                    agents = copilots + claudes
                    lags: list[float] = []

                    async def lag() -> None:
                        while True:
                            t = time.perf_counter()
                            await asyncio.sleep(0.01)
                            lags.append(time.perf_counter() - t - 0.01)

                    lagging = asyncio.create_task(lag())
                    latencies = await _latency(redis_url, prefix, sessions, agents, samples)
                    lagging.cancel()
                    await asyncio.sleep(2.0)  # the last turns end: idle
                    rss = {
                        runtime: sum(_rss_mib(_pid(sessions, a)) for a in names) / len(names)
                        for runtime, names in (("copilot", copilots), ("claude_agent", claudes))
                    }
                    lost = 0
                    for agent, api in ((copilots[0], "openai"), (claudes[0], "anthropic")):
                        lost += await _kill_phase(relay, sessions, agent, apis, api)
                finally:
                    stop.set()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(hosting, 60)
        figures = {
            "workbench_prompt_p50_ms": round(_percentile(latencies, 0.50) * 1000, 1),
            "workbench_prompt_p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
            "workbench_sessions": len(entries),
            "workbench_rss_copilot_mib": round(rss["copilot"]),
            "workbench_rss_claude_agent_mib": round(rss["claude_agent"]),
            "workbench_loop_lag_p99_ms": round(_percentile(lags, 0.99) * 1000, 1),
            "workbench_lost": lost,
        }
        print(
            f"workbench: {len(entries)} sessions ({PER_RUNTIME} Copilot SDK, {PER_RUNTIME} Claude Agent "
            f"SDK); send -> prompt handed to the session p50 {figures['workbench_prompt_p50_ms']} ms, p99 "
            f"{figures['workbench_prompt_p99_ms']} ms ({len(latencies)} envelopes; host loop lag p99 "
            f"{figures['workbench_loop_lag_p99_ms']} ms); idle RSS per session: "
            f"Copilot {figures['workbench_rss_copilot_mib']} MiB, "
            f"Claude {figures['workbench_rss_claude_agent_mib']} MiB; {lost} of {2 * KILL_ENVELOPES} "
            "envelopes lost with the session CLIs SIGKILLed",
            flush=True,
        )
        return figures
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pid(sessions: WorkbenchSessions, agent: str) -> int:
    live = sessions.live(f"workbench.{agent}")
    assert live is not None and live.pid is not None
    return live.pid


async def _latency(
    redis_url: str, prefix: str, sessions: TimedSessions, agents: list[str], samples: int
) -> list[float]:
    sender = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "bench" / "workbench.py"),
        "--sender",
        redis_url,
        prefix,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert sender.stdin is not None and sender.stdout is not None
    latencies = []
    last: dict[str, str] = {}
    try:
        for n in range(samples):
            agent = agents[n % len(agents)]
            # the session's own turn time is the SDK's, not relay's: send to a session that is idle,
            # its last prompt accepted (a session that has not started that prompt's turn yet is
            # not busy either)
            live, before = sessions.live(f"workbench.{agent}"), last.get(agent)

            def idle(live: Any = live, before: str | None = before) -> bool:
                accepted = before is None or before in sessions.accepted
                return accepted and live is not None and not live.busy and live.queued == 0

            await _until(idle, 30)
            sender.stdin.write(f"{agent} {n}\n".encode())
            await sender.stdin.drain()
            line = (await asyncio.wait_for(sender.stdout.readline(), 30)).decode().split()
            if len(line) != 2:
                raise RuntimeError(f"the sender process ended (exit {await sender.wait()})")
            sent_id, started = line[0], float(line[1])
            last[agent] = sent_id
            while sent_id not in sessions.handed:
                sessions.changed.clear()
                await asyncio.wait_for(sessions.changed.wait(), 30)
            latencies.append(sessions.handed[sent_id] - started)
    finally:
        sender.stdin.close()
        await asyncio.wait_for(sender.wait(), 30)
    return latencies


async def _sender(redis_url: str, prefix: str) -> None:
    """``--sender``: for each ``<agent> <n>`` line on stdin, send agent a note as ``bench`` and print
    the envelope id and when the send was called (``time.perf_counter``, the host's clock too)."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with messenger_on(redis_url, DeliverySettings(), prefix=prefix) as messenger:
        while line := (await reader.readline()).decode().split():
            agent, n = line
            started = time.perf_counter()
            sent = await messenger.relay.send(
                "bench", agent, AgentMessage(kind=Kind.KIND_NOTE, text=f"note {n}"), session="bench-1"
            )
            print(sent.id, repr(started), flush=True)


async def _kill_phase(
    relay: Relay[AgentMessage], sessions: TimedSessions, agent: str, apis: ModelAPIs, api: str
) -> int:
    ids = []
    for n in range(KILL_ENVELOPES):
        sent = await relay.send(
            "bench", agent, AgentMessage(kind=Kind.KIND_NOTE, text=f"kill {n}"), session="bench-1"
        )
        ids.append(sent.id)
        if n == KILL_AFTER:
            await _settled(relay, ids[:KILL_AFTER], 30)
            with contextlib.suppress(ProcessLookupError):
                os.kill(_pid(sessions, agent), signal.SIGKILL)
    await _settled(relay, ids, BOUND)
    seen = await apis.texts(api)
    return sum(1 for i in ids if i not in seen)


async def _settled(relay: Relay[AgentMessage], ids: list[str], within: float) -> None:
    """Until every envelope of ``ids`` is acknowledged or dead-lettered, ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        states = await relay.status("bench", ids)
        if all(s.state in ("acknowledged", "dead_lettered") for s in states):
            return
        await asyncio.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--sender", nargs=2, metavar=("REDIS_URL", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sender:
        asyncio.run(_sender(*args.sender))
        return 0
    from adapters.redis.embedded import EmbeddedRedis

    tmp = Path(tempfile.mkdtemp(prefix="relay-wb-redis-"))
    server = EmbeddedRedis(tmp)
    server.start()
    try:
        figures = asyncio.run(workbench_figures(server.url, samples=args.samples))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("relay-bench-workbench " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 1 if figures.get("workbench_lost") else 0


if __name__ == "__main__":
    raise SystemExit(main())
