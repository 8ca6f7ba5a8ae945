"""``relay serve`` plus one bench-only tool, ``NoOp``: the MCP ceiling on the very same server.

Run exactly like the product (``python bench/noop_worker.py serve --redis-url ... --port ...``): the
real ``broker.cli`` entry point, the real app from ``broker.front.app.create_app`` with the four relay
tools, the auth middleware and the same uvicorn settings. The only difference is one extra tool that
does nothing, so a call to it costs what the HTTP + auth + MCP SDK layers cost and nothing more. The
product never registers it.
"""

from __future__ import annotations

import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

import broker.front.app as front_app
from broker.cli import main
from broker.front.tools import build_mcp_server

NOOP_TOOL = "NoOp"


def build_with_noop(relay: Any, *, max_wait: float) -> MCPServer:
    server = build_mcp_server(relay, max_wait=max_wait)

    @server.tool(name=NOOP_TOOL, description="Bench only: does nothing and returns an empty object.")
    async def noop() -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="{}")], structured_content={})

    return server


front_app.build_mcp_server = build_with_noop

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
