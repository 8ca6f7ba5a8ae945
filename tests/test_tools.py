"""Each agent tool on its own: called directly (no HTTP, no MCP session) on a memory-backed relay."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from mcp.types import CallToolResult

from broker.agent_message import AgentMessage, AgentMessageContract
from broker.front.tokens import AgentIdentity
from broker.front.tools import (
    AcknowledgeAgentInbox,
    AgentTool,
    FetchAgentInbox,
    RegisterAgentAddress,
    SendAgentMessage,
    encoded_size,
    encoded_size_bound,
    relay_tools,
)
from broker.relay import Relay
from tests.support import memory_relays

ALICE = AgentIdentity("alice", "a-1", 2**40)
BOB = AgentIdentity("bob", "b-1", 2**40)
REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


@pytest.fixture
async def relay() -> AsyncIterator[Relay[AgentMessage]]:
    async with memory_relays(AgentMessageContract(), 1) as (relay,):
        for who in (ALICE, BOB):
            assert not (await RegisterAgentAddress(relay).call(who, REGISTER)).is_error
        yield relay


def data(result: CallToolResult) -> dict[str, Any]:
    """A success's data: structured content only, no second encoding as text."""
    assert not result.is_error and result.content == [], result
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def refusal(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error and result.structured_content is None
    error: dict[str, Any] = json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
    return error


async def test_register_answers_the_registration_and_refuses_a_network_address(
    relay: Relay[AgentMessage],
) -> None:
    tool = RegisterAgentAddress(relay)
    done = data(await tool.call(ALICE, {"provider": "claudecode", "endpoint": "[::1]:9"}))
    assert (done["agent"], done["session"], done["endpoint"], done["tier"]) == (
        "alice",
        "a-1",
        "[::1]:9",
        "host",
    )
    error = refusal(await tool.call(ALICE, {"provider": "claudecode", "endpoint": "example.net:443"}))
    assert error["code"] == "invalid_address"
    error = refusal(await tool.call(ALICE, {"provider": 7, "endpoint": "127.0.0.1:1"}))
    assert error["violations"] == [
        {"field": "provider", "rule": "type", "message": "must be a string, not a number"}
    ]


async def test_send_queues_for_the_recipient_and_refusals_store_nothing(relay: Relay[AgentMessage]) -> None:
    tool = SendAgentMessage(relay)
    sent = data(await tool.call(ALICE, {"to": "bob", "message": {"kind": "request", "text": "hi"}}))
    assert sent["to"] == "bob" and sent["tier"] == "host" and sent["sent_at"].endswith("Z")
    error = refusal(await tool.call(ALICE, {"to": "bob", "message": {"kind": 3, "text": "no reply-to"}}))
    assert error["code"] == "contract_violation"
    assert [e.id for e in await relay.fetch("bob", 16)] == [sent["id"]]


async def test_fetch_returns_the_envelope_as_published_and_checks_wait_ms(relay: Relay[AgentMessage]) -> None:
    await relay.send("alice", "bob", AgentMessage(kind=1, text="note", reference="r"), session="a-1")
    tool = FetchAgentInbox(relay)
    (envelope,) = data(await tool.call(BOB, {"limit": 4}))["envelopes"]
    assert envelope["from"] == "alice" and envelope["deliveries"] == 1
    assert envelope["message"] == {"kind": 1, "text": "note", "reference": "r"}
    error = refusal(await tool.call(BOB, {"wait_ms": -1}))
    assert error["violations"][0]["rule"] == "wait_ms.range"
    assert str(tool.max_wait_ms) in error["message"] and str(tool.max_wait_ms) in tool.description


async def test_acknowledge_reports_what_it_did_not_know(relay: Relay[AgentMessage]) -> None:
    sent = await relay.send("alice", "bob", AgentMessage(kind=1, text="x"), session="a-1")
    await relay.fetch("bob", 1)
    unknown = "env_" + "0" * 26
    done = data(await AcknowledgeAgentInbox(relay).call(BOB, {"ids": [sent.id, unknown]}))
    assert done == {"acknowledged": [sent.id], "unknown": [unknown]}


@pytest.mark.parametrize(
    "tool", ["RegisterAgentAddress", "SendAgentMessage", "FetchAgentInbox", "AcknowledgeAgentInbox"]
)
async def test_every_tool_refuses_unknown_and_missing_argument_names_first(
    relay: Relay[AgentMessage], tool: str
) -> None:
    (chosen,) = [t for t in relay_tools(relay) if t.name == tool]
    error = refusal(await chosen.call(ALICE, {"agent\n": "bob"}))
    assert error["violations"][0] == {
        "field": "agent\\n",
        "rule": "unknown_field",
        "message": f"unknown argument; {tool} takes {sorted(chosen.input_schema['properties'])}",
    }
    required = chosen.input_schema.get("required", [])
    if required:
        error = refusal(await chosen.call(ALICE, {}))
        assert error["violations"][0]["rule"] == "required" and error["violations"][0]["field"] == required[0]


class Broken(AgentTool):
    name = "Broken"
    description = "fails"
    input_schema = {"type": "object", "properties": {}}

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        raise KeyError("a bug, with a secret in it")


async def test_an_unexpected_failure_is_an_internal_error_whose_details_stay_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, "relay.front"):
        error = refusal(await Broken().call(ALICE, {}))
    assert error["code"] == "internal_error" and "secret" not in json.dumps(error)
    assert "secret" in caplog.text


async def test_a_fetch_size_bound_is_never_below_the_encoded_size(relay: Relay[AgentMessage]) -> None:
    # Given envelopes whose characters encode to the most bytes each (escapes, astral characters)
    texts = ["\x00" * 500, "\U0001f600" * 500, '"\\' * 300, "x"]
    first = await relay.send("alice", "bob", AgentMessage(kind=1, text="first"), session="a-1")
    for text in texts:
        body = AgentMessage(kind=3, text=text, in_reply_to=first.id, reference="\x01" * 40)
        await relay.send("alice", "bob", body, session="a-1", ttl_ms=60_000)
    # When each is shaped as FetchAgentInbox returns it, Then its bound holds its encoded size
    tool = FetchAgentInbox(relay)
    for envelope in await relay.fetch("bob", 16, session="b-1"):
        item = tool.inbox_envelope(envelope)
        assert encoded_size(item) <= encoded_size_bound(envelope, item)


NULS = "\x00" * 43_000  # 43 kB stored, 258 kB encoded ("\u0000" is six bytes of JSON)


async def test_a_fetch_result_is_bounded_in_bytes_and_always_holds_one_envelope(
    relay: Relay[AgentMessage],
) -> None:
    sent = [
        (await relay.send("alice", "bob", AgentMessage(kind=1, text=NULS), session="a-1")).id
        for _ in range(5)
    ]
    tool = FetchAgentInbox(relay, max_response_bytes=600_000)
    first = data(await tool.call(BOB, {"limit": 256}))["envelopes"]
    assert [e["id"] for e in first] == sent[:2]
    assert encoded_size(first) <= 600_000
    assert [
        e["id"] for e in data(await FetchAgentInbox(relay, max_response_bytes=10).call(BOB, {}))["envelopes"]
    ] == (sent[:1])
    await relay.ack("bob", sent[:2])
    rest = data(await tool.call(BOB, {"limit": 256}))["envelopes"]
    # what was left out comes first next time; the store counted each fetch as a hand-out
    assert [e["id"] for e in rest] == sent[2:4]
    assert [e["deliveries"] for e in rest] == [3, 3]
    assert all(e["message"]["text"] == NULS for e in first + rest)
