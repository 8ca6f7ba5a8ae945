"""The one table that maps ``RelayError.code`` to HTTP status and to what an MCP client sees.

Tool failures are MCP tool results with ``isError: true`` (clients and models read them); their text
is JSON: ``{"error": {"code", "message", "retryable", ...details}}``.
"""

from __future__ import annotations

import json
from typing import Final

from mcp.types import CallToolResult, TextContent

from broker.errors import RelayError

HTTP_STATUS: Final[dict[str, int]] = {
    "invalid_argument": 400,
    "invalid_address": 400,
    "contract_violation": 422,
    "unknown_recipient": 404,
    "unregistered_agent": 409,
    "session_superseded": 409,
    "inbox_full": 429,
    "rate_limited": 429,
    "backend_unavailable": 503,
    "relay_not_running": 503,
    "internal_error": 500,
}


def http_status(error: RelayError) -> int:
    return HTTP_STATUS.get(error.code, 500)


def error_body(error: RelayError) -> dict[str, object]:
    return {
        "error": {
            "code": error.code,
            "message": error.message,
            "retryable": error.retryable,
            **error.details(),
        }
    }


def tool_error(error: RelayError) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(error_body(error), ensure_ascii=False))],
        is_error=True,
    )
