"""A parked ``FetchAgentInbox`` whose caller is gone gives its wait slot back at once: real HTTP clients
that hang up mid-poll, the official ``mcp`` client cancelling a call (both protocol eras), and an
explicit ``notifications/cancelled`` on a stateless endpoint, matched by agent, session and request
id. Before, 16 hung-up polls locked the agent out of long-polls and ``/agent/wait`` (``too_many_waits``)
until their ``wait_ms`` ran out."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest

from broker.front.paths import WAIT_PATH
from broker.testing.polling import eventually
from tests.front_support import Front, data, running_front
from tests.processes import MCP_HEADERS, REGISTER, call_tool, tool_result

pytestmark = pytest.mark.asyncio

PER_AGENT = 16  # the default cap (RedisSettings.max_waits_per_agent)
LONG = {"limit": 16, "wait_ms": 20000}
"""A poll that parks far longer than any test step may take."""


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


async def _registered(front: Front, *agents: str) -> None:
    for agent in agents:
        async with front.client(agent, f"{agent}-1") as client:
            data(await client.call_tool("RegisterAgentAddress", REGISTER))


async def _parked(front: Front, agent: str, count: int) -> None:
    await eventually(
        lambda: front.relay.parked_fetches(agent) == count, 5, f"{count} polls of {agent} parked"
    )


async def test_polls_whose_callers_hang_up_give_their_slots_back(front: Front) -> None:
    await _registered(front, "alice", "bob")
    headers = front.headers("bob", "bob-1")
    clients = [httpx2.AsyncClient(timeout=60) for _ in range(PER_AGENT)]
    polls = [
        asyncio.create_task(call_tool(http, front.url, headers, "FetchAgentInbox", LONG)) for http in clients
    ]
    await _parked(front, "bob", PER_AGENT)
    for poll in polls:
        poll.cancel()  # the HTTP client gives up: its connection is closed
    for http in clients:
        await http.aclose()
    await _parked(front, "bob", 0)
    async with httpx2.AsyncClient(timeout=60) as http:
        # the agent's polls and waits are served again, long before the hung-up polls' wait_ms
        poll = asyncio.create_task(call_tool(http, front.url, headers, "FetchAgentInbox", LONG))
        await _parked(front, "bob", 1)
        woken = await http.post(front.base + WAIT_PATH, json={"timeout_ms": 0}, headers=headers)
        assert woken.status_code == 200, woken.text
        async with front.client("alice", "alice-1") as alice:
            sent = data(
                await alice.call_tool("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "hi"}})
            )
        got = await asyncio.wait_for(poll, 5)
        assert [e["id"] for e in got["structuredContent"]["envelopes"]] == [sent["id"]]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_official_clients_cancelled_call_gives_its_slot_back(front: Front, mode: str) -> None:
    await _registered(front, "bob")
    async with front.client("bob", "bob-1", mode=mode) as bob:
        poll = asyncio.create_task(bob.call_tool("FetchAgentInbox", LONG))
        await _parked(front, "bob", 1)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
        await _parked(front, "bob", 0)
        assert data(await bob.call_tool("FetchAgentInbox", {"limit": 1})) == {"envelopes": []}


def _cancel(request_id: int) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
    )


async def test_notifications_cancelled_ends_the_parked_call_it_names_and_no_other(front: Front) -> None:
    await _registered(front, "bob", "carol")
    bob, carol = front.headers("bob", "bob-1"), front.headers("carol", "carol-1")
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "FetchAgentInbox", "arguments": LONG},
    }
    async with httpx2.AsyncClient(timeout=60) as http:

        async def poll(headers: dict[str, str]) -> dict[str, Any]:
            answer = await http.post(front.url, content=json.dumps(body), headers={**MCP_HEADERS, **headers})
            return tool_result(answer)

        bobs, carols = asyncio.create_task(poll(bob)), asyncio.create_task(poll(carol))
        await _parked(front, "bob", 1)
        await _parked(front, "carol", 1)
        other = front.headers("bob", "bob-2")  # the same agent's other session cannot cancel it
        for headers, request_id in ((carol, 8), (other, 7), (bob, 7)):
            sent = await http.post(front.url, content=_cancel(request_id), headers={**MCP_HEADERS, **headers})
            assert sent.status_code == 202, sent.text
        got = await asyncio.wait_for(bobs, 5)  # answered at once, with what there is: nothing
        assert got["structuredContent"] == {"envelopes": []}
        assert front.relay.parked_fetches("bob") == 0 and front.relay.parked_fetches("carol") == 1
        assert not carols.done()
        carols.cancel()
        await _parked(front, "carol", 0)
