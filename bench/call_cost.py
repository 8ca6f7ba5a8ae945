"""CPU per tool call of the agent endpoint, in one process, without sockets between client and front.

    python bench/call_cost.py                 # 3 rounds of 200 cycles: 16 sends, one fetch, one ack
    python bench/call_cost.py --profile DIR   # and one more round, a cProfile per tool: DIR/TOOL.pstats

The app is the one ``relay serve`` builds (``create_app`` over a relay on the Redis backend, with the
bench-only ``NoOp`` tool of ``bench/noop_worker.py``), driven as an ASGI application: each call is the
HTTP request the official ``mcp`` client sends (recorded from it once, then replayed with new
arguments), so the figure is the front's CPU per call from the request's headers to its response
body, the Redis round trip included (a real ``redis-server`` on loopback), the HTTP server's parsing
and the client excluded. Process CPU time is summed per tool; ``NoOp`` is the SDK's own cost, the
ceiling's. Much steadier than the MCP phase of ``bench/run.py`` on a shared machine, since other
processes' load does not move a process's own CPU time much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import noop_worker  # bench/noop_worker.py (this script's directory is on sys.path): adds NoOp
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from adapters.redis.embedded import EmbeddedRedis
from broker.agent_message import AgentMessageContract
from broker.front.app import create_app
from broker.front.key_file import load_key_file
from broker.front.tokens import KeyRing, agent_headers, generate_key
from broker.relay import Relay

BATCH = 16
TEXT_BYTES = 300
TOOLS = ("SendAgentMessage", "FetchAgentInbox", "AcknowledgeAgentInbox", noop_worker.NOOP_TOOL)


class Recorder:
    """Keeps the headers and the ``params._meta`` of the last request the real client sent through it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers: list[tuple[bytes, bytes]] = []
        self.meta: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.headers = list(scope["headers"])

        async def recording() -> Message:
            message = await receive()
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.meta = json.loads(message.get("body", b""))["params"]["_meta"]
            return message

        await self.app(scope, recording, send)


class Caller:
    """Replays ``tools/call`` requests with the recorded headers straight into the ASGI app."""

    def __init__(self, app: ASGIApp, headers: list[tuple[bytes, bytes]], meta: dict[str, Any]) -> None:
        self.app = app
        self.meta = meta
        dropped = (b"content-length", b"host", b"mcp-name")
        self.headers = [(k, v) for k, v in headers if k not in dropped]
        self.headers.append((b"host", b"127.0.0.1:8000"))
        self.seq = 0
        self.cpu: dict[str, float] = dict.fromkeys(TOOLS, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(TOOLS, 0)
        self.profilers: dict[str, cProfile.Profile] = {}
        """Per tool, when profiling: each of its calls is profiled, and nothing else."""

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": self.seq,
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments, "_meta": self.meta},
            }
        ).encode()
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/mcp/agent",
            "raw_path": b"/mcp/agent",
            "query_string": b"",
            "root_path": "",
            "headers": [
                *self.headers,
                (b"mcp-name", tool.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        sent = False
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # never: the request has no more body
            raise AssertionError

        async def send(message: Message) -> None:
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        profiler = self.profilers.get(tool)
        cpu0 = time.process_time()
        if profiler is not None:
            profiler.enable()
        await self.app(scope, receive, send)
        if profiler is not None:
            profiler.disable()
        self.cpu[tool] += time.process_time() - cpu0
        self.calls[tool] += 1
        reply = json.loads(b"".join(chunks))
        if "result" not in reply:
            raise RuntimeError(f"{tool}: {reply}")
        result: dict[str, Any] = reply["result"]
        if result.get("isError"):
            raise RuntimeError(f"{tool} failed: {result}")
        structured: dict[str, Any] = result["structuredContent"]
        return structured


@contextlib.asynccontextmanager
async def front(url: str, keyring: KeyRing) -> AsyncIterator[ASGIApp]:
    """The app ``relay serve`` builds (see ``relay/serve.py``), with the NoOp tool, running."""
    connection = RedisConnection(RedisSettings(url=url))
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
        notices=RedisNoticeStore(connection),
    )
    async with relay:
        app = create_app(relay, keyring=keyring)
        async with app.router.lifespan_context(app):
            yield app


async def measure(cycles: int, rounds: int, profile: Path | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="relay-call-cost-"))
    server = EmbeddedRedis(tmp / "redis", appendfsync="everysec")
    server.start()
    (tmp / "relay.key").write_text(generate_key() + "\n")
    (tmp / "relay.key").chmod(0o600)
    keyring = load_key_file(tmp / "relay.key")
    try:
        async with front(server.url, keyring) as app:
            recorder = Recorder(app)
            headers = agent_headers(keyring, "alice", "alice-1", 3600)
            transport = httpx2.ASGITransport(app=recorder)
            async with (
                httpx2.AsyncClient(transport=transport, headers=headers, base_url="http://127.0.0.1") as http,
                Client(streamable_http_client("http://127.0.0.1/mcp/agent", http_client=http)) as client,
            ):
                await client.call_tool(
                    "RegisterAgentAddress", {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
                )
                await client.call_tool(noop_worker.NOOP_TOOL, {})
            caller = Caller(app, recorder.headers, recorder.meta)
            print(
                f"# {cycles} cycles per round: {BATCH} x SendAgentMessage, FetchAgentInbox, "
                f"AcknowledgeAgentInbox; {cycles * BATCH} x NoOp"
            )
            for r in range(rounds + 1):
                caller.cpu = dict.fromkeys(TOOLS, 0.0)
                caller.calls = dict.fromkeys(TOOLS, 0)
                if profile is not None and r == rounds:
                    caller.profilers = {tool: cProfile.Profile() for tool in TOOLS}
                for i in range(cycles):
                    for k in range(BATCH):
                        text = f"bench {r}.{i}.{k} ".ljust(TEXT_BYTES, "x")
                        await caller.call(
                            "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": text}}
                        )
                    got = await caller.call("FetchAgentInbox", {"limit": BATCH})
                    await caller.call("AcknowledgeAgentInbox", {"ids": [e["id"] for e in got["envelopes"]]})
                    for _ in range(BATCH):
                        await caller.call(noop_worker.NOOP_TOOL, {})
                if r == 0:
                    continue  # warm-up
                per = {t: caller.cpu[t] / caller.calls[t] * 1e6 for t in TOOLS}
                relay_calls = sum(caller.calls[t] for t in TOOLS[:3])
                mix = sum(caller.cpu[t] for t in TOOLS[:3]) / relay_calls * 1e6
                print(
                    f"round {r}: µs CPU per call  send {per['SendAgentMessage']:6.0f}  fetch16 "
                    f"{per['FetchAgentInbox']:6.0f}  ack16 {per['AcknowledgeAgentInbox']:6.0f}  "
                    f"relay mix {mix:6.0f}  NoOp {per['NoOp']:6.0f}  gap {mix - per['NoOp']:5.0f}",
                    flush=True,
                )
            if profile is not None:
                for tool, profiler in caller.profilers.items():
                    profiler.dump_stats(str(profile / f"{tool}.pstats"))
                print(f"# profiles of each tool's calls in the last round: {profile}/TOOL.pstats")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200, help="cycles per round (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument(
        "--profile", type=Path, help="one more round, with a cProfile of each tool's calls in this directory"
    )
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    try:
        import uvloop  # as `relay serve` runs its workers
    except ImportError:
        asyncio.run(measure(args.cycles, args.rounds, args.profile))
    else:
        uvloop.run(measure(args.cycles, args.rounds, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
