"""The body type holds end to end: send and fetch ``AgentMessage`` with no casts and no ``Any``.

mypy --strict checks this module with ``disallow_any_expr`` (see pyproject.toml): any expression whose
type degrades to ``Any`` between sender, inbox and receiver fails the type check.
"""

from __future__ import annotations

from typing import assert_type

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from broker.addresses import ClaudeCodeAddress, WorkbenchAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Envelope
from broker.relay import Relay


async def test_agent_message_flows_typed_from_send_to_fetch() -> None:
    state = MemoryState()
    relay: Relay[AgentMessage] = Relay(AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state))
    async with relay:
        await relay.register("planner", WorkbenchAddress.parse("session-1"), "s1")
        await relay.register("reviewer", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s2")
        request = AgentMessage(kind=Kind.KIND_REQUEST, text="review PR 12", reference="pr/12")
        sent = await relay.send("planner", "reviewer", request)
        assert_type(sent, Envelope[AgentMessage])
        fetched = await relay.fetch("reviewer", 16)
        assert_type(fetched, list[Envelope[AgentMessage]])
        message = fetched[0].message
        assert_type(message, AgentMessage)
        assert message.kind == Kind.KIND_REQUEST
        assert message.text == "review PR 12"
        assert message.HasField("reference") and message.reference == "pr/12"
        reply = AgentMessage(kind=Kind.KIND_REPLY, text="approved", in_reply_to=fetched[0].id)
        await relay.send("reviewer", "planner", reply)
        (answer,) = await relay.fetch("planner", 1)
        assert_type(answer.message.in_reply_to, str)
        assert answer.message.in_reply_to == sent.id
