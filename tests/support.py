"""Shared test helpers: backends wired the way production wires them, on a real server."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from adapters.memory import MemoryInboxStore, MemoryNoticeStore, MemoryRegistry, MemoryState
from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from broker.addresses import Address, ClaudeCodeAddress, RemoteAddress, WorkbenchAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.contract import Contract
from broker.envelope import Tier, now_ms
from broker.errors import ContractViolation, Violation
from broker.relay import Relay
from broker.testing.base import Limits

B = TypeVar("B")
ROOT = Path(__file__).resolve().parents[1]


def address_for(tier: Tier, agent: str) -> Address:
    if tier is Tier.IN_PROCESS:
        return WorkbenchAddress.parse(f"wb-{agent}")
    if tier is Tier.HOST:
        return ClaudeCodeAddress.parse("127.0.0.1:14111")
    return RemoteAddress.parse("agents.example.net:443")


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@contextlib.asynccontextmanager
async def memory_relays(
    contract: Contract[B], count: int, limits: Limits = Limits(), *, state: MemoryState | None = None
) -> AsyncIterator[list[Relay[B]]]:
    """``count`` started relays on one ``MemoryState`` (``state``, or a new one built with ``limits``)."""
    state = state or memory_state(limits)
    relays = [
        Relay(
            contract,
            MemoryInboxStore(state),
            MemoryRegistry(state),
            notices=MemoryNoticeStore(state),
            remind_after=limits.remind_after,
            clock=state.clock,
        )
        for _ in range(count)
    ]
    async with contextlib.AsyncExitStack() as stack:
        for relay in relays:
            await stack.enter_async_context(relay)
        yield relays


def old_registration(agent: str) -> dict[str, str]:
    """A registration hash as relay's earlier layout wrote it (and redis-cli could): no directory
    index beside it."""
    return {
        "agent": agent,
        "provider": "claudecode",
        "endpoint": "127.0.0.1:14111",
        "tier": "host",
        "session": f"{agent}-1",
        "registered_at": "2026-11-29T13:00:00.000Z",
        "updated_at": "2026-11-29T13:00:00.000Z",
    }


def memory_state(limits: Limits = Limits()) -> MemoryState:
    return MemoryState(
        inbox_cap=limits.inbox_cap,
        send_rate=limits.send_rate,
        send_burst=limits.send_burst,
        max_waits_per_agent=limits.max_waits_per_agent,
        max_waits=limits.max_waits,
        max_deliveries=limits.max_deliveries,
        clock=limits.clock or now_ms,
    )


@contextlib.asynccontextmanager
async def redis_relays(
    contract: Contract[B], url: str, count: int, limits: Limits = Limits(), *, prefix: str | None = None
) -> AsyncIterator[list[Relay[B]]]:
    settings = RedisSettings(
        url=url,
        prefix=prefix or unique_prefix(),
        inbox_cap=limits.inbox_cap,
        send_rate=limits.send_rate,
        send_burst=limits.send_burst,
        max_waits_per_agent=limits.max_waits_per_agent,
        max_waits=limits.max_waits,
        max_deliveries=limits.max_deliveries,
    )
    clock = limits.clock or now_ms
    relays: list[Relay[B]] = []
    for _ in range(count):
        connection = RedisConnection(settings)
        relays.append(
            Relay(
                contract,
                RedisInboxStore(connection, clock=clock),
                RedisRegistry(connection),
                notices=RedisNoticeStore(connection),
                remind_after=limits.remind_after,
                clock=clock,
            )
        )
    async with contextlib.AsyncExitStack() as stack:
        for relay in relays:
            await stack.enter_async_context(relay)
        yield relays


@dataclass(frozen=True)
class Text:
    """A second body type, to show the relay and its conformance suite are generic."""

    value: str


class TextContract:
    type_name = "tests.Text"

    def validate(self, body: Text) -> None:
        if not body.value:
            raise ContractViolation([Violation("value", "required", "value is required")])

    def to_fields(self, body: Text) -> dict[str, str]:
        return {"value": body.value}

    def from_fields(self, fields: Mapping[str, str]) -> Text:
        return Text(fields["value"])

    def to_json(self, body: Text) -> dict[str, object]:
        return {"value": body.value}

    def from_json(self, data: object) -> Text:
        if not isinstance(data, dict) or not isinstance(data.get("value"), str):
            raise ContractViolation([Violation("value", "type", "must be a string")])
        return Text(data["value"])


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, rest = line.strip().partition(" ")
            rows.append((instruction.upper(), rest.strip()))
    return rows


@contextlib.asynccontextmanager
async def relay_on(url: str, **settings: object) -> AsyncIterator[Relay[AgentMessage]]:
    connection = RedisConnection(RedisSettings(url=url, prefix=unique_prefix(), **settings))  # type: ignore[arg-type]
    async with Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection)) as relay:
        yield relay


def note(n: int) -> AgentMessage:
    return AgentMessage(kind=Kind.KIND_NOTE, text=f"note {n}")
