"""Refusals as MCP tool results: ``isError: true`` with the JSON of ``broker.errors.error_body`` as
text (clients and models read it)."""

from __future__ import annotations

import json

from mcp.types import CallToolResult, TextContent

from broker.errors import RelayError, error_body


def tool_error(error: RelayError) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(error_body(error), ensure_ascii=False))],
        is_error=True,
    )
