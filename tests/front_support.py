"""Helpers for front tests: the real app on uvicorn on a free loopback port, and real MCP clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client import CollectorRegistry

from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from adapters.redis.operator_view import RedisOperatorView
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.front.app import create_app
from broker.front.http_limits import DEFAULT_MAX_BODY_BYTES
from broker.front.tokens import KeyRing, agent_headers, generate_key
from broker.front.tools import DEFAULT_TOOLS, ToolOptions
from broker.limits import DEFAULT_HISTORY_RETENTION_MS, MAX_WAIT_SECONDS
from broker.relay import Relay
from broker.testing.polling import eventually
from tests.support import unique_prefix


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Front:
    url: str
    base: str
    keyring: KeyRing
    relay: Relay[AgentMessage]
    connection: RedisConnection | None = None
    tools: ToolOptions = DEFAULT_TOOLS
    """The tools the front serves (its ``SearchAgentMessages`` reads the same store)."""

    def headers(self, agent: str, session: str, ttl: int = 3600) -> dict[str, str]:
        return agent_headers(self.keyring, agent, session, ttl)

    @contextlib.asynccontextmanager
    async def client(self, agent: str, session: str, mode: str = "auto") -> AsyncIterator[Client]:
        http = httpx2.AsyncClient(headers=self.headers(agent, session), timeout=httpx2.Timeout(30, read=60))
        async with http, Client(streamable_http_client(self.url, http_client=http), mode=mode) as client:
            yield client


@contextlib.asynccontextmanager
async def serve_app(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn in this event loop; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), 5, "uvicorn started")
        if not server.started:
            raise RuntimeError("uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def running_front(
    redis_url: str,
    *,
    prefix: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait: float = MAX_WAIT_SECONDS,
    history_retention_ms: int = DEFAULT_HISTORY_RETENTION_MS,
) -> AsyncIterator[Front]:
    keyring = KeyRing([secrets.token_bytes(32)])
    settings = RedisSettings(
        url=redis_url, prefix=prefix or unique_prefix(), history_retention_ms=history_retention_ms
    )
    connection = RedisConnection(settings)
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
        max_wait=max_wait,
        notices=RedisNoticeStore(connection),
    )
    async with relay:
        options = ToolOptions(mail=RedisOperatorView(connection))
        app = create_app(relay, keyring=keyring, max_body_bytes=max_body_bytes, tool_options=options)
        async with serve_app(app) as base:
            yield Front(
                url=f"{base}/mcp/agent",
                base=base,
                keyring=keyring,
                relay=relay,
                connection=connection,
                tools=options,
            )


def key_file(tmp: Path) -> Path:
    path = tmp / "relay.key"
    path.write_text(generate_key() + "\n")
    path.chmod(0o600)
    return path


def data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def error(result: Any) -> dict[str, Any]:
    assert result.is_error, result
    body = json.loads(result.content[0].text)
    assert isinstance(body["error"], dict)
    return body["error"]
