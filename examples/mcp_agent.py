"""A short MCP agent for ``relay serve``: the official ``mcp`` SDK, headers from ``relay agent-headers``.

Run two of them against a running ``relay serve`` (from the folder it runs in, so ``relay
agent-headers`` finds its key in ``.relay/``)::

    .venv/bin/python examples/mcp_agent.py bob                       # waits for a request, answers it
    .venv/bin/python examples/mcp_agent.py alice --ask bob "Ready?"  # asks, waits for the answer

Each registers (a loopback endpoint: the MCP endpoint takes host-tier addresses), then long-polls
``FetchAgentInbox``, acknowledges what it read and, for a request, replies with ``in_reply_to``.
A message is a proposal, never an instruction: this agent only prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

WAIT_MS = 20_000
SEND_ATTEMPTS = 30  # the other agent may not have registered yet: unknown_recipient until it does


def headers_for(agent: str, session: str) -> dict[str, str]:
    """The three headers of every /mcp/agent request, minted by ``relay agent-headers``."""
    minted = subprocess.run(
        [sys.executable, "-m", "relay", "agent-headers", "--agent", agent, "--session", session],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if minted.returncode != 0:
        raise SystemExit(minted.stderr.strip())
    headers: dict[str, str] = json.loads(minted.stdout)
    return headers


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        error = json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
        raise RuntimeError(f"{tool}: {error['code']}: {error['message']}")
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def next_envelope(client: Client, polls: int) -> dict[str, Any] | None:
    for _ in range(polls):
        found = await call(client, "FetchAgentInbox", {"limit": 1, "wait_ms": WAIT_MS})
        if found["envelopes"]:
            envelope: dict[str, Any] = found["envelopes"][0]
            return envelope
    return None


async def send(client: Client, to: str, message: dict[str, Any]) -> dict[str, Any]:
    for _ in range(SEND_ATTEMPTS - 1):
        try:
            return await call(client, "SendAgentMessage", {"to": to, "message": message})
        except RuntimeError as exc:
            if "unknown_recipient" not in str(exc):
                raise
            await asyncio.sleep(1)
    return await call(client, "SendAgentMessage", {"to": to, "message": message})


async def run(args: argparse.Namespace) -> int:
    session = args.session or f"{args.agent}-example"
    http = httpx2.AsyncClient(headers=headers_for(args.agent, session), timeout=httpx2.Timeout(30, read=60))
    async with http, Client(streamable_http_client(args.url, http_client=http)) as client:
        await call(client, "RegisterAgentAddress", {"provider": "claudecode", "endpoint": "127.0.0.1:14111"})
        print(f"{args.agent}: registered as session {session}", flush=True)
        if args.ask is not None:
            to, text = args.ask
            sent = await send(client, to, {"kind": "request", "text": text})
            print(f"{args.agent}: asked {to} ({sent['id']})", flush=True)
        envelope = await next_envelope(client, args.polls)
        if envelope is None:
            print(f"{args.agent}: no mail", flush=True)
            return 1
        message = envelope["message"]
        print(f"{args.agent}: from {envelope['from']}: {message['text']!r} ({envelope['id']})", flush=True)
        await call(client, "AcknowledgeAgentInbox", {"ids": [envelope["id"]]})
        if message["kind"] == 2:
            answer = {
                "kind": "reply",
                "text": f"{args.agent} read: {message['text']}",
                "in_reply_to": envelope["id"],
            }
            sent = await send(client, envelope["from"], answer)
            print(f"{args.agent}: replied to {envelope['from']} ({sent['id']})", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="A short MCP agent for relay serve.")
    parser.add_argument("agent", help="this agent's id, e.g. alice")
    parser.add_argument("--ask", nargs=2, metavar=("TO", "TEXT"), help="send a request first, then wait")
    parser.add_argument("--session", help="session id (default AGENT-example)")
    parser.add_argument("--url", default="http://127.0.0.1:8080/mcp/agent", help="relay's /mcp/agent URL")
    parser.add_argument("--polls", type=int, default=3, help=f"long-polls of {WAIT_MS} ms before giving up")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
