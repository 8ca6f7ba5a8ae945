"""The published tool schemas against what the tools really do, over real HTTP with the official client.

Results must validate against their output schemas (with every optional field present and absent), every
argument the input schemas refuse must be refused by the tool with a structured error, and every argument
they allow must be accepted, so the schemas a client reads are exactly the contract it gets. Every
property is described, and the registration lists the providers each front takes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from broker import schemas
from broker.front.tools import ToolOptions, relay_tools
from tests.front_support import Front, running_front

REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
ALL_SCHEMAS = {
    name: value
    for name, value in vars(schemas).items()
    if name.isupper() and not name.startswith("_") and isinstance(value, dict)
}


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


@pytest.mark.parametrize("name", sorted(ALL_SCHEMAS))
def test_every_schema_is_a_valid_2020_12_schema_without_indirection(name: str) -> None:
    schema = ALL_SCHEMAS[name]
    Draft202012Validator.check_schema(schema)
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text and "null" not in text.replace('"null"', "")


async def test_the_listing_publishes_the_schemas_of_broker_schemas(front: Front) -> None:
    async with front.client("alice", "a-1") as alice:
        listed = {tool.name: tool for tool in (await alice.list_tools()).tools}
    local = {tool.name: tool for tool in relay_tools(front.relay, front.tools)}
    assert (
        set(listed)
        == set(local)
        == {
            "RegisterAgentAddress",
            "SendAgentMessage",
            "FetchAgentInbox",
            "AcknowledgeAgentInbox",
            "ListAgents",
            "GetMessageStatus",
            "SearchAgentMessages",
        }
    )
    for name, tool in local.items():
        assert listed[name].input_schema == tool.input_schema
        assert listed[name].output_schema == tool.output_schema


async def test_real_results_validate_against_the_output_schemas(front: Front) -> None:
    seen: dict[str, list[dict[str, Any]]] = {}

    inputs = {
        tool.name: Draft202012Validator(tool.input_schema) for tool in relay_tools(front.relay, front.tools)
    }

    async def call(client: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        assert not list(inputs[tool].iter_errors(arguments)), (tool, arguments)
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content
        assert result.content == []  # the data is in structured content, not encoded twice
        seen.setdefault(tool, []).append(result.structured_content)
        return dict(result.structured_content)

    async with front.client("alice", "a-1") as alice, front.client("bob", "b-1") as bob:
        await call(alice, "RegisterAgentAddress", REGISTER)
        await call(bob, "RegisterAgentAddress", REGISTER)
        async with front.client("alice", "a-2") as again:  # supersedes: superseded_session present
            await call(again, "RegisterAgentAddress", REGISTER)
        first = await call(bob, "SendAgentMessage", {"to": "alice", "message": {"kind": 2, "text": "q"}})
        message = {"kind": "reply", "text": "a", "in_reply_to": first["id"], "reference": "https://x/1"}
        await call(bob, "SendAgentMessage", {"to": "alice", "message": message})
        options = {"idempotency_key": "k-1", "ttl_ms": 60_000}
        last = await call(
            bob, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "n"}, **options}
        )
        await call(bob, "GetMessageStatus", {"ids": [first["id"], last["id"], "env_" + "0" * 26]})
    async with front.client("alice", "a-2") as alice:
        inbox = await call(alice, "FetchAgentInbox", {"limit": 16})
        await call(alice, "FetchAgentInbox", {"limit": 16, "wait_ms": None})
        assert [e["message"] for e in inbox["envelopes"]] == [
            {"kind": 2, "text": "q"},
            {"kind": 3, "text": "a", "in_reply_to": first["id"], "reference": "https://x/1"},
            {"kind": 1, "text": "n"},
        ]
        await call(alice, "AcknowledgeAgentInbox", {"ids": [e["id"] for e in inbox["envelopes"]]})
        await call(alice, "FetchAgentInbox", {})
        await call(alice, "ListAgents", {"limit": 1})
        await call(alice, "ListAgents", {"after": "alice"})
        await call(alice, "SearchAgentMessages", {"query": "q", "limit": 1})
        await call(alice, "SearchAgentMessages", {"with": "bob", "cursor": None, "thread": first["id"]})
    assert "superseded_session" in seen["RegisterAgentAddress"][-1]
    assert "next" in seen["ListAgents"][0] and "next" not in seen["ListAgents"][1]
    outputs = {
        "RegisterAgentAddress": schemas.REGISTRATION,
        "SendAgentMessage": schemas.SENT,
        "FetchAgentInbox": schemas.INBOX,
        "AcknowledgeAgentInbox": schemas.ACKNOWLEDGEMENT,
        "GetMessageStatus": schemas.STATUSES,
        "ListAgents": schemas.AGENTS,
        "SearchAgentMessages": schemas.MAIL,
    }
    assert [s["state"] for s in seen["GetMessageStatus"][0]["statuses"]] == ["queued", "queued", "unknown"]
    assert set(seen) == set(outputs)
    published = {tool.name: tool.output_schema for tool in relay_tools(front.relay, front.tools)}
    for tool, results in seen.items():
        assert published[tool] == outputs[tool]  # what a client validates with is the full schema
        validator = Draft202012Validator(outputs[tool])
        for result in results:
            assert not list(validator.iter_errors(result)), (tool, result)


REFUSED_BY_SCHEMA: list[tuple[str, dict[str, Any]]] = [
    ("RegisterAgentAddress", {"provider": "claudecode"}),
    ("RegisterAgentAddress", {**REGISTER, "agent": "bob"}),
    ("RegisterAgentAddress", {"provider": 1, "endpoint": "127.0.0.1:1"}),
    ("SendAgentMessage", {"to": "bob"}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "from": "eve"}),
    ("SendAgentMessage", {"to": "Bob!", "message": {"kind": 1, "text": "x"}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": True, "text": "x"}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": "order", "text": "x"}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": ""}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x", "extra": 1}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x", "in_reply_to": "nope"}}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x", "reference": ""}}),
    ("FetchAgentInbox", {"limit": 0}),
    ("FetchAgentInbox", {"limit": 257}),
    ("FetchAgentInbox", {"limit": 1.5}),
    ("FetchAgentInbox", {"limit": "1"}),
    ("FetchAgentInbox", {"wait_ms": -1}),
    ("FetchAgentInbox", {"wait_ms": "100"}),
    ("FetchAgentInbox", {"agent": "bob"}),
    ("AcknowledgeAgentInbox", {}),
    ("AcknowledgeAgentInbox", {"ids": "env_"}),
    ("AcknowledgeAgentInbox", {"ids": ["nope"]}),
    ("AcknowledgeAgentInbox", {"ids": ["env_" + "0" * 26] * 1025}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "idempotency_key": ""}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "idempotency_key": "a{b}"}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "idempotency_key": 5}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "ttl_ms": 999}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "ttl_ms": "1000"}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1, "text": "x"}, "ttl_ms": 30 * 86_400_000 + 1}),
    ("GetMessageStatus", {}),
    ("GetMessageStatus", {"ids": []}),
    ("GetMessageStatus", {"ids": ["nope"]}),
    ("GetMessageStatus", {"ids": ["env_" + "0" * 26] * 257}),
]


SEND: dict[str, Any] = {"to": "bob", "message": {"kind": 1, "text": "x"}}
ACCEPTED_BY_SCHEMA: list[tuple[str, dict[str, Any]]] = [
    # JSON Schema counts 1.0 as an integer: so does every tool
    ("SendAgentMessage", {"to": "bob", "message": {"kind": 1.0, "text": "x"}}),
    ("SendAgentMessage", {**SEND, "ttl_ms": 60000.0}),
    ("FetchAgentInbox", {"limit": 1.0}),
    ("FetchAgentInbox", {"limit": 2.0, "wait_ms": 0.0}),
    ("ListAgents", {"limit": 1.0}),
    # an optional argument that is null is absent
    ("SendAgentMessage", {**SEND, "ttl_ms": None, "idempotency_key": None}),
    (
        "SendAgentMessage",
        {"to": "bob", "message": {"kind": 1, "text": "x", "in_reply_to": None, "reference": None}},
    ),
    ("FetchAgentInbox", {"limit": None, "wait_ms": None}),
    ("ListAgents", {"limit": None, "after": None}),
    ("SendAgentMessage", {"to": "bob", "message": {"kind": "note", "text": "x"}}),
    ("AcknowledgeAgentInbox", {"ids": []}),
    ("GetMessageStatus", {"ids": ["env_" + "0" * 26]}),
    ("RegisterAgentAddress", {"provider": "claudecode", "endpoint": "[::1]:14111"}),
]


async def test_the_tools_refuse_what_the_input_schemas_refuse_and_accept_what_they_allow(
    front: Front,
) -> None:
    inputs = {
        tool.name: Draft202012Validator(tool.input_schema) for tool in relay_tools(front.relay, front.tools)
    }
    async with front.client("alice", "a-1") as alice, front.client("bob", "b-1") as bob:
        for client in (alice, bob):
            assert not (await client.call_tool("RegisterAgentAddress", REGISTER)).is_error
        for tool, arguments in REFUSED_BY_SCHEMA:
            assert list(inputs[tool].iter_errors(arguments)), (tool, arguments)
            result = await alice.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            error = json.loads(result.content[0].text)["error"]
            assert error["code"] in {"invalid_argument", "invalid_address", "contract_violation"}, error
            assert error["retryable"] is False and error["violations"][0]["rule"], error
        assert (await front.relay.fetch("bob", 256)) == []  # nothing refused was stored
        for tool, arguments in ACCEPTED_BY_SCHEMA:
            assert not list(inputs[tool].iter_errors(arguments)), (tool, arguments)
            result = await alice.call_tool(tool, arguments)
            assert not result.is_error, (tool, arguments, result.content)
    sent = await front.relay.fetch("bob", 256)
    assert [e.message.kind for e in sent] == [1] * 5  # each send stored, kind 1.0 as kind 1


def _properties(schema: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every property of ``schema`` (nested objects and array items included), by its path."""
    found: list[tuple[str, Any]] = []
    if not isinstance(schema, dict):
        return found
    for name, sub in schema.get("properties", {}).items():
        found.append((f"{path}.{name}", sub))
        found.extend(_properties(sub, f"{path}.{name}"))
    if isinstance(schema.get("items"), dict):
        found.extend(_properties(schema["items"], f"{path}[]"))
    return found


@pytest.mark.parametrize(
    "options",
    [ToolOptions(), ToolOptions(network=True)],
    ids=["host", "network"],
)
async def test_every_property_is_described_and_every_container_lists_its_parts(
    front: Front, options: ToolOptions
) -> None:
    for tool in relay_tools(front.relay, replace(options, mail=front.tools.mail)):
        for kind, schema in (("input", tool.input_schema), ("output", tool.output_schema)):
            assert schema is not None, tool.name
            for path, sub in _properties(schema):
                assert sub.get("description"), f"{tool.name} {kind} {path} has no description"
                if sub.get("type") == "object":
                    assert sub.get("properties"), f"{tool.name} {kind} {path} lists no properties"
                if sub.get("type") == "array":
                    assert isinstance(sub.get("items"), dict), f"{tool.name} {kind} {path} lists no items"
            assert schema.get("properties"), f"{tool.name} {kind} lists no properties"


async def test_the_registration_lists_the_providers_each_front_takes(front: Front) -> None:
    def providers(options: ToolOptions) -> list[str]:
        (register,) = [t for t in relay_tools(front.relay, options) if t.name == "RegisterAgentAddress"]
        return list(register.input_schema["properties"]["provider"]["enum"])

    assert providers(ToolOptions()) == ["claudecode"]
    assert providers(ToolOptions(network=True)) == ["remote"]
    async with front.client("alice", "a-1") as alice:
        listed = {tool.name: tool for tool in (await alice.list_tools()).tools}
    assert listed["RegisterAgentAddress"].input_schema["properties"]["provider"]["enum"] == ["claudecode"]
