"""``relay serve`` plus one bench-only tool, ``NoOp``: the MCP ceiling on the very same server.

Run exactly like the product (``python bench/noop_worker.py serve --redis-url ... --port ...``): the
real ``relay.cli`` entry point, the real app from ``broker.front.app.create_app`` with the four relay
tools, the auth middleware and the same uvicorn settings. The only difference is one extra tool that
does nothing, dispatched exactly like the relay tools (same server, same identity lookup, same argument
name check, same error handling), so a call to it costs what the HTTP + auth + MCP SDK layers cost and
nothing more. The product never registers it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from mcp.server.lowlevel import Server
from mcp.types import CallToolResult, TextContent

import broker.front.app as front_app
from broker.front.server import build_mcp_server
from broker.front.tokens import AgentIdentity
from broker.front.tools import AgentTool
from relay.cli import main

NOOP_TOOL = "NoOp"


class NoOp(AgentTool):
    name = NOOP_TOOL
    description = "Bench only: does nothing and returns an empty object."
    input_schema = {"type": "object", "properties": {}, "additionalProperties": False}

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="{}")], structured_content={})


NOOP = NoOp()


def build_with_noop(relay: Any, **options: Any) -> Server[Any]:
    return build_mcp_server(relay, extra_tools=[NOOP], **options)


front_app.build_mcp_server = build_with_noop

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
