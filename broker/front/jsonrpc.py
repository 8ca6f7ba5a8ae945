"""The JSON-RPC error response, the one body every refusal of ``/mcp/agent`` carries (the request
guards', the authentication's, the HTTP server's own) and the codes it uses."""

from __future__ import annotations

import json
from collections.abc import Mapping

from mcp.types import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, UNSUPPORTED_PROTOCOL_VERSION
from starlette.responses import JSONResponse

__all__ = [
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "UNAUTHORIZED",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "RequestId",
    "error_body",
    "error_bytes",
    "error_response",
]

RequestId = str | int
UNAUTHORIZED = -32001
"""relay's code for a request without valid agent credentials (HTTP 401)."""


def error_body(
    code: int, message: str, request_id: RequestId | None = None, data: object = None
) -> dict[str, object]:
    """The JSON-RPC error response; ``id`` null when the request's could not be read."""
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def error_bytes(code: int, message: str, data: object = None) -> bytes:
    """``error_body`` (``id`` null) encoded, for an HTTP server that writes its answer itself."""
    return json.dumps(
        error_body(code, message, None, data), ensure_ascii=False, separators=(",", ":")
    ).encode()


def error_response(
    status: int,
    code: int,
    message: str,
    *,
    request_id: RequestId | None = None,
    data: object = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """``error_body`` as an HTTP response. Text quoted from the request is escaped by the caller
    (``broker.text.shown``): a message is printable and always encodes."""
    return JSONResponse(error_body(code, message, request_id, data), status_code=status, headers=headers)
