"""Refusals as the front answers them: MCP tool results (``isError: true`` with the JSON of
``broker.errors.error_body`` as text, which clients and models read), and HTTP statuses for the routes
that are not MCP (the same JSON as body)."""

from __future__ import annotations

import json

from mcp.types import CallToolResult, TextContent

from broker.errors import (
    AgentRetired,
    BackendRefused,
    BackendUnavailable,
    InternalError,
    InvalidArgument,
    NotAccepted,
    RateLimited,
    RelayError,
    RelayNotRunning,
    SessionNotRegistered,
    SessionSuperseded,
    TooManyFailures,
    TooManyWaits,
    UnregisteredAgent,
    error_body,
)
from broker.front.tokens import AuthError


def tool_error(error: RelayError) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(error_body(error), ensure_ascii=False))],
        is_error=True,
    )


_STATUS: dict[type[RelayError], int] = {
    InvalidArgument: 400,
    UnregisteredAgent: 404,
    NotAccepted: 403,
    SessionSuperseded: 409,
    SessionNotRegistered: 409,
    AgentRetired: 410,
    TooManyWaits: 429,
    RateLimited: 429,
    TooManyFailures: 429,
    AuthError: 401,
    InternalError: 500,
    BackendRefused: 500,
    BackendUnavailable: 503,
    RelayNotRunning: 503,
}


def http_status(error: RelayError) -> int:
    """The HTTP status of a refusal on the routes that are not MCP: 4xx when the request should not be
    repeated as it is (429: later), 5xx when relay could not answer now."""
    for kind in type(error).__mro__:
        status = _STATUS.get(kind)
        if status is not None:
            return status
    return 503 if error.retryable else 400
