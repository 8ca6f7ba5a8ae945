"""``search_agent_messages``, the Workbench sessions' search of their own mail, on memory, one Redis and
a 3-master cluster: the arguments and result of ``SearchAgentMessages``, bound to the session's agent
(another agent's mail is never returned, not even counted), and listed by the Copilot and Claude
Agent SDK adapters (without a model turn)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.memory.operator_view import MemoryOperatorView
from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.operator_view import RedisOperatorView
from adapters.workbench import SessionMessaging, SessionTool
from broker import schemas
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.delivery import DeliverySettings
from broker.messenger import Messenger
from broker.relay import Relay
from broker.testing.polling import eventually
from relay.workbench import messenger_over
from tests.support import unique_prefix
from tests.test_workbench import Prompts

FAST = DeliverySettings(max_attempts=3, visibility=30.0, backoff_base=0.01, backoff_cap=0.04, poll=0.2)
BOUND = 10.0
BACKENDS = ["memory", "redis", "cluster"]
SEARCH = "search_agent_messages"


@contextlib.asynccontextmanager
async def messaging(
    backend: str, request: pytest.FixtureRequest, prompts: Prompts
) -> AsyncIterator[SessionMessaging]:
    """Session messaging with a view of its store, wired as ``relay.workbench.host`` wires it."""
    if backend == "memory":
        state = MemoryState()
        relay = Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state))
        async with (
            relay,
            Messenger(relay, MemoryDeliveryQueue(state), FAST) as messenger,
            SessionMessaging(messenger, prompts, MemoryOperatorView(state)) as bound,
        ):
            yield bound
        return
    url = request.getfixturevalue("redis_url" if backend == "redis" else "cluster_url")
    connection = RedisConnection(RedisSettings(url=url, prefix=unique_prefix()))
    async with (
        messenger_over(connection, FAST) as messenger,
        SessionMessaging(messenger, prompts, RedisOperatorView(connection)) as bound,
    ):
        yield bound


def tool(tools: list[SessionTool], name: str) -> SessionTool:
    (found,) = [t for t in tools if t.name == name]
    return found


def ids(result: dict[str, Any]) -> list[str]:
    return [m["id"] for m in result["messages"]]


async def test_the_search_tool_is_listed_with_the_arguments_of_search_agent_messages(
    request: pytest.FixtureRequest,
) -> None:
    async with messaging("memory", request, Prompts()) as bound:
        tools = bound.tools("s-planner", agent="planner")
    assert [t.name for t in tools] == ["register_agent", "send_agent_message", SEARCH]
    assert tool(tools, SEARCH).input_schema == schemas.SEARCH_ARGUMENTS


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_session_finds_its_own_agents_mail_both_ways_and_nothing_else(
    backend: str, request: pytest.FixtureRequest
) -> None:
    prompts = Prompts()
    async with messaging(backend, request, prompts) as bound:
        relay = bound.messenger.relay
        planner = bound.tools("s-planner", agent="planner")
        builder = bound.tools("s-builder", agent="builder")
        for session, agent in (("s-planner", "planner"), ("s-builder", "builder")):
            await bound.register(session, agent)
        await relay.register("carol", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s-carol")

        async def send(tools: list[SessionTool], to: str, message: dict[str, Any]) -> str:
            sent = await tool(tools, "send_agent_message").call({"to": to, "message": message})
            return str(sent["id"])

        async def search(tools: list[SessionTool], **arguments: Any) -> dict[str, Any]:
            found = await tool(tools, SEARCH).call(arguments)
            assert "error" not in found, found
            return found

        async def archived(tools: list[SessionTool], count: int, **arguments: Any) -> dict[str, Any]:
            """The search once ``count`` messages are found (a prompt is acknowledged after submit)."""
            found: dict[str, Any] = {}

            async def enough() -> bool:
                found.update(await search(tools, **arguments))
                return len(found["messages"]) >= count

            await eventually(enough, BOUND, f"{count} messages archived for {arguments}")
            return found

        ask = await send(planner, "builder", {"kind": 2, "text": "Deploy the API please"})
        aside = str(
            (
                await relay.send(
                    "carol", "builder", AgentMessage(kind=Kind.KIND_NOTE, text="deploy secretly")
                )
            ).id
        )
        await archived(builder, 2)  # both delivered to builder's session and acknowledged
        answer = await send(builder, "planner", {"kind": 3, "text": "api deployed", "in_reply_to": ask})
        mine = await archived(planner, 2)
        assert sorted(ids(mine)) == sorted([ask, answer]) and "next" not in mine
        first = next(m for m in mine["messages"] if m["id"] == ask)
        assert (first["from"], first["to"], first["outcome"]) == ("planner", "builder", "acknowledged")
        assert first["message"] == {"kind": 2, "text": "Deploy the API please"}
        assert set(first) == set(schemas.MAIL["properties"]["messages"]["items"]["properties"])
        assert ids(await search(planner, query="API DEPLOY")) == [ask]
        assert ids(await search(planner, query="deployed")) == [answer]
        assert ids(await search(planner, **{"with": "carol"})) == []
        assert sorted(ids(await search(planner, thread=answer))) == sorted([ask, answer])
        # builder received carol's letter; planner never sees it, nor its count
        assert set(ids(await search(builder, query="deploy"))) == {ask, aside}  # "deployed" is another word
        before = await search(planner, query="deploy")
        for n in range(20):
            await relay.send("carol", "builder", AgentMessage(kind=Kind.KIND_NOTE, text=f"deploy {n}"))
        await archived(builder, 22, query="deploy", limit=100)
        assert await search(planner, query="deploy") == before

        seen: list[str] = []
        page = await search(planner, limit=1)
        for _ in range(4):
            seen += ids(page)
            if "next" not in page:
                break
            page = await search(planner, limit=1, cursor=page["next"])
        assert seen == ids(mine)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_search_tool_refuses_what_it_cannot_read(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with messaging(backend, request, Prompts()) as bound:
        loose = bound.tools("s-loose")  # not bound, never registered
        refused = await tool(loose, SEARCH).call({})
        assert refused["error"]["code"] == "invalid_argument"  # type: ignore[index]
        assert refused["error"]["violations"][0]["field"] == "session"  # type: ignore[index]

        planner = bound.tools("s-planner", agent="planner")
        unregistered = await tool(planner, SEARCH).call({})
        assert unregistered["error"]["code"] == "unregistered_agent"  # type: ignore[index]
        await bound.register("s-planner", "planner")
        for arguments, field in (
            ({"query": "!!!"}, "query"),
            ({"since": "yesterday"}, "since"),
            ({"cursor": "nope"}, "cursor"),
            ({"limit": 0}, "limit"),
            ({"thread": "env_x"}, "thread"),
            ({"with": "Not An Id"}, "with"),
            ({"other": 1}, "other"),
        ):
            found = await tool(planner, SEARCH).call(arguments)
            error: Any = found["error"]
            assert error["code"] == "invalid_argument", (arguments, found)
            assert error["violations"][0]["field"] == field, (arguments, found)
        assert (await tool(planner, SEARCH).call({"limit": 2.0, "query": None}))["messages"] == []

        # another session takes the agent over: the old session's search is refused, not answered
        await bound.register("s-planner-2", "planner")
        superseded = await tool(planner, SEARCH).call({})
        assert superseded["error"]["code"] == "session_superseded"  # type: ignore[index]
        assert (await tool(bound.tools("s-planner-2"), SEARCH).call({}))["messages"] == []


async def test_the_sdk_adapters_list_the_search_tool_and_call_it_without_a_model(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    copilot = pytest.importorskip("copilot.tools", reason="the copilot extra is not installed")
    pytest.importorskip("claude_agent_sdk", reason="the claude-agent extra is not installed")
    from adapters.workbench.claude_agent import SERVER, ClaudeLive, claude_tool
    from adapters.workbench.copilot import copilot_tool
    from adapters.workbench.runtime import SessionSpec

    async with messaging("memory", request, Prompts()) as bound:
        await bound.register("s-planner", "planner")
        tools = bound.tools("s-planner", agent="planner")
        spec = SessionSpec("planner", "s-planner", "model", tmp_path / "work", tmp_path / "state")
        spec.state_dir.mkdir()  # the options name a launcher written there (no process is started)
        live = ClaudeLive(spec, tools, session_id="00000000-0000-4000-8000-000000000000")
        assert f"mcp__{SERVER}__{SEARCH}" in live._options.allowed_tools
        claude = claude_tool(tool(tools, SEARCH))
        assert (claude.name, claude.input_schema) == (SEARCH, schemas.SEARCH_ARGUMENTS)
        answered = await claude.handler({"query": "anything"})
        assert json.loads(answered["content"][0]["text"]) == {"messages": []} and not answered["is_error"]

        github = copilot_tool(tool(tools, SEARCH))
        assert (github.name, github.parameters) == (SEARCH, schemas.SEARCH_ARGUMENTS)
        result = await github.handler(copilot.ToolInvocation(tool_name=SEARCH, arguments={"limit": 0}))
        assert result.result_type == "failure" and "limit" in result.text_result_for_llm
