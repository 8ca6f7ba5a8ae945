"""The agent endpoint answers like the JSON-RPC specification where the MCP SDK alone would not: raw HTTP
(httpx) for what the official ``mcp`` client cannot send, the client itself where it can (an invalid
``tools/list`` cursor). Every refusal is a short JSON-RPC error with the request's ``id`` when it has a
readable one, and nothing reaches the log as an error or a traceback."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types.version import SUPPORTED_PROTOCOL_VERSIONS

from tests.front_support import Front, running_front
from tests.fuzz_support import ErrorLog, error_log
from tests.processes import REGISTER

__all__ = ["error_log"]

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


async def post(front: Front, body: Any, **headers: str) -> httpx2.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(
            front.url, content=content, headers={**front.headers("alice", "a-1"), **ACCEPT, **headers}
        )


def refusal(response: httpx2.Response, status: int, code: int, request_id: Any) -> str:
    """The error message of a JSON-RPC refusal, checked to be one short line with the given id."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["jsonrpc"], body["id"], body["error"]["code"]) == ("2.0", request_id, code), body
    message: str = body["error"]["message"]
    assert len(message) < 300 and "\n" not in message and "pydantic" not in message, message
    return message


@pytest.mark.parametrize(
    ("body", "request_id", "says"),
    [
        ({"jsonrpc": "2.0", "id": 7}, 7, "method is required"),
        ({"jsonrpc": "2.0", "id": "q-1", "params": {}}, "q-1", "method is required"),
        ({"jsonrpc": "1.0", "id": 8, "method": "tools/list"}, 8, 'jsonrpc must be "2.0"'),
        ({"id": 9, "method": "tools/list"}, 9, 'jsonrpc must be "2.0"'),
        ({"jsonrpc": "2.0", "id": 10, "method": 5}, 10, "method must be a string"),
        ([{"jsonrpc": "2.0", "id": 11, "method": "tools/list"}], None, "batches are not accepted"),
        ([], None, "batches are not accepted"),
        ("tools/list", None, "not a string"),
        ({"jsonrpc": "2.0", "id": 12, "result": {}}, 12, "a response is not accepted"),
        # the SDK alone takes these for notifications: 202, and the caller waits for ever
        ({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, None, "id must be a string or an integer"),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}, None, "id must be a string or an integer"),
        ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, None, "id must be a string or an integer"),
        (
            {"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"},
            None,
            "id must be a string or an integer",
        ),
        (b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "tools/list"}', None, "Parse error"),
    ],
)
async def test_an_invalid_request_gets_32600_with_its_id(
    front: Front, error_log: ErrorLog, body: Any, request_id: Any, says: str
) -> None:
    response = await post(front, body)
    code = -32700 if says == "Parse error" else -32600
    assert says in refusal(response, 400, code, request_id)
    assert error_log.problems() == []


async def test_params_that_are_not_an_object_get_32602(front: Front) -> None:
    response = await post(front, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": [1, 2]})
    assert "params must be an object" in refusal(response, 400, -32602, 3)


async def test_an_unsupported_protocol_version_names_the_header_and_the_supported_ones(front: Front) -> None:
    body = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    response = await post(front, body, **{"mcp-protocol-version": "1999-01-01"})
    message = refusal(response, 400, -32022, 4)
    assert "MCP-Protocol-Version" in message and "'1999-01-01'" in message
    assert all(version in message for version in SUPPORTED_PROTOCOL_VERSIONS), message
    data = response.json()["error"]["data"]
    assert data == {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": "1999-01-01"}
    for version in ("2025-06-18", None):  # a supported revision, and none at all, are served
        headers = {"mcp-protocol-version": version} if version else {}
        assert "tools" in (await post(front, body, **headers)).json()["result"]


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
async def test_a_wrong_content_type_gets_415_with_a_json_body(front: Front, content_type: str) -> None:
    response = await post(
        front, {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, **{"content-type": content_type}
    )
    assert "Content-Type must be application/json" in refusal(response, 415, -32600, None)
    fine = await post(
        front,
        {"jsonrpc": "2.0", "id": 6, "method": "tools/list"},
        **{"content-type": "application/json; charset=utf-8"},
    )
    assert fine.status_code == 200 and "tools" in fine.json()["result"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_tools_list_with_an_invalid_cursor_gets_32602(front: Front, mode: str) -> None:
    async with front.client("alice", "a-1", mode=mode) as alice:
        listed = await alice.list_tools()
        assert listed.next_cursor is None and len(listed.tools) == 7
        with pytest.raises(MCPError) as refused:
            await alice.list_tools(cursor="not-a-cursor", cache_mode="bypass")
        assert refused.value.error.code == -32602
        assert "invalid cursor 'not-a-cursor'" in refused.value.error.message
        assert not (await alice.call_tool("RegisterAgentAddress", REGISTER)).is_error


async def test_other_methods_reach_the_sdk(front: Front) -> None:
    unknown = await post(front, {"jsonrpc": "2.0", "id": 13, "method": "relay/nothing"})
    assert unknown.json()["error"]["code"] == -32601 and unknown.json()["id"] == 13
    notification = await post(front, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert notification.status_code == 202
