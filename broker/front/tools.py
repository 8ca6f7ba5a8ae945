"""The agent tools: each an ``AgentTool`` over a running relay, testable on its own.

A tool has a name, a description, the JSON schemas from ``broker.schemas`` and ``run`` (verified
caller, arguments) -> result. ``call`` is what the MCP server invokes: it refuses unknown and missing
argument names, runs the tool and turns every refusal into a structured ``isError`` result. Every tool
names the caller's session, so a superseded session is refused. ``broker.front.server`` serves them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from mcp.types import CallToolResult

from broker import schemas
from broker.addresses import HumanAddress, host_providers, network_providers
from broker.agent_message import AgentMessage
from broker.envelope import Envelope, format_ms
from broker.errors import (
    InternalError,
    InvalidAddress,
    InvalidArgument,
    RelayError,
    UnregisteredAgent,
    json_type,
)
from broker.front.errors import tool_error
from broker.front.hangup import unless_abandoned
from broker.front.tokens import AgentIdentity
from broker.ids import check_agent_id
from broker.limits import DEFAULT_FETCH_LIMIT, MAX_FETCH_LIMIT, MAX_STATUS_IDS
from broker.ports import IOperatorView
from broker.relay import Relay
from broker.text import failure, shown
from broker.webhooks import IWebhookTargets, is_webhook_endpoint, new_secret

log = logging.getLogger("relay.front")

MAX_FETCH_RESPONSE_BYTES: Final = 1024 * 1024
"""Encoded envelopes one ``FetchAgentInbox`` result holds at most (one envelope always fits)."""


class AgentTool:
    """One tool of the agent endpoint. A subclass names itself in class attributes and implements
    ``run``; ``run`` gets arguments whose names the input schema allows and whose required names are
    present, and checks their values itself (or leaves that to the relay)."""

    name: ClassVar[str]
    description: str
    input_schema: Mapping[str, Any]
    output_schema: ClassVar[Mapping[str, Any] | None] = None
    _allowed: ClassVar[frozenset[str]]
    _required: ClassVar[tuple[str, ...]]
    _optional: ClassVar[frozenset[str]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "input_schema" in vars(cls):
            cls._allowed = frozenset(cls.input_schema.get("properties", {}))
            cls._required = tuple(cls.input_schema.get("required", ()))
            cls._optional = cls._allowed - frozenset(cls._required)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        raise NotImplementedError

    async def call(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        """Check the argument names, run the tool; a refusal becomes an ``isError`` result, and an
        unexpected failure an ``internal`` one (logged in one line, never sent)."""
        try:
            self.check_names(arguments)
            return await self.run(who, self.accepted(arguments))
        except RelayError as exc:
            return tool_error(exc)
        except Exception as exc:
            log.error("tool %s failed unexpectedly: %s", self.name, failure(exc), extra={"agent": who.agent})
            return tool_error(InternalError())

    def accepted(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """The arguments as ``run`` reads them: what the input schema allows is accepted, so an
        optional argument that is ``null`` is absent, and ``1.0`` where an integer goes is ``1``."""
        if any(arguments[name] is None for name in self._optional if name in arguments):
            arguments = {k: v for k, v in arguments.items() if v is not None or k not in self._optional}
        accepted: Mapping[str, Any] = schemas.integral(self.input_schema, arguments)
        return accepted

    def check_names(self, arguments: Mapping[str, Any]) -> None:
        """Refuse unknown and missing arguments (the schemas' ``additionalProperties: false`` and
        ``required``), before any value is looked at."""
        for name in arguments:
            if name not in self._allowed:
                takes = f"unknown argument; {self.name} takes {sorted(self._allowed)}"
                raise InvalidArgument(shown(name), "unknown_field", takes)
        for name in self._required:
            if name not in arguments:
                raise InvalidArgument(name, "required", f"{self.name} needs this argument")


class RelayTool(AgentTool):
    """A tool over a running relay."""

    def __init__(self, relay: Relay[AgentMessage]) -> None:
        self.relay = relay


class RegisterAgentAddress(RelayTool):
    """Register where the caller can be reached (host-tier addresses only on this endpoint)."""

    name = "RegisterAgentAddress"
    description = (
        "Register where this agent can be reached. Call once per session and again after every "
        "restart. Only host-tier addresses are accepted here: provider 'claudecode' with endpoint "
        "'127.0.0.1:PORT', '[::1]:PORT', 'localhost:PORT' or 'unix:/absolute/path'. Registering from a "
        "new session supersedes the old one and keeps the inbox."
    )
    input_schema = schemas.REGISTER_ARGUMENTS
    output_schema = schemas.REGISTRATION

    NETWORK_DESCRIPTION: ClassVar[str] = (
        "Register where this agent can be reached. Call once per session and again after every "
        "restart. Only network addresses are accepted here: provider 'remote' with endpoint an "
        "'https://' URL (relay then POSTs signed mail-pending notifications there; the result's "
        "webhook_secret verifies them) or a non-loopback 'host:port'. Registering from a new session "
        "supersedes the old one and keeps the inbox."
    )

    def __init__(self, relay: Relay[AgentMessage], options: ToolOptions | None = None) -> None:
        super().__init__(relay)
        options = options if options is not None else DEFAULT_TOOLS
        self.webhooks = options.webhooks
        endpoints = schemas.HOST_ENDPOINTS
        if options.network:
            self.providers = network_providers()
            self.description = self.NETWORK_DESCRIPTION
            endpoints = schemas.NETWORK_ENDPOINTS
        else:
            self.providers = host_providers()
        # Per instance: the providers this front takes are listed (enum) in the published schema.
        self.input_schema = schemas.register_arguments(self.providers.names, endpoints)

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        provider = _string(arguments, "provider")
        if provider == HumanAddress.provider:
            raise InvalidAddress(
                "provider",
                "provider.person",
                "'human' is the provider of people, whom `relay send` and the dashboard register; an agent "
                f"registers with provider {' or '.join(map(repr, self.providers.names))} (see the tool's "
                "description for the endpoint)",
            )
        address = self.providers.parse(provider, _string(arguments, "endpoint"))
        done = await self.relay.register(who.agent, address, who.session)
        reg = done.registration
        outcome = "created" if done.created else "updated"
        log.info("registered", extra={"agent": reg.agent, "tier": reg.tier.label, "outcome": outcome})
        result = schemas.registration_result(done)
        if self.webhooks is not None and is_webhook_endpoint(reg.provider, reg.endpoint):
            secret = new_secret()
            if await self.webhooks.set_secret(reg.agent, reg.session, reg.endpoint, secret):
                result["webhook_secret"] = secret
        return tool_result(result)


class SendAgentMessage(RelayTool):
    """Validate a message and queue it in the recipient's inbox; the sender is always the caller."""

    name = "SendAgentMessage"
    description = (
        "Send a message to another registered agent. kind: 1 note, 2 request, 3 reply (needs "
        "in_reply_to = the envelope id you answer), 4 status. The sender is always you. Refused "
        "messages list every violated rule and are not stored. Pass an idempotency_key to make a retry "
        "safe (the same key returns the first result and stores nothing), and ttl_ms to let the message "
        "expire unread. Follow it with GetMessageStatus."
    )
    input_schema = schemas.SEND_ARGUMENTS
    output_schema = schemas.SENT

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        to = arguments["to"]
        try:
            body = self.relay.contract.from_json(arguments["message"])
            sent = await self.relay.send(
                who.agent,
                to,
                body,
                session=who.session,
                idempotency_key=arguments.get("idempotency_key"),
                ttl_ms=arguments.get("ttl_ms"),
            )
        except RelayError as exc:
            # `to` is unchecked input here: escaped and cut, so it cannot forge or flood log lines
            shown_to = shown(to) if isinstance(to, str) else "?"
            log.info("send refused", extra={"from": who.agent, "to": shown_to, "outcome": exc.code})
            raise
        if log.isEnabledFor(logging.INFO):
            log.info(
                "sent",
                extra={
                    "envelope": sent.id,
                    "from": who.agent,
                    "to": to,
                    "tier": sent.tier.label,
                    "outcome": "ok",
                },
            )
        return tool_result(schemas.sent_result(sent))


class FetchAgentInbox(RelayTool):
    """The caller's unacknowledged envelopes, oldest first; optionally waits for one.

    One result holds at most ``max_response_bytes`` of encoded envelopes (always at least one): a
    message's text may encode to six times its stored size (``\u0000``), and 256 of them would make a
    response of well over 100 MB. The envelopes left out stay unacknowledged and come first at the next
    fetch; the store counted them as handed out, so their ``deliveries`` is one higher then. A parked
    fetch whose caller hangs up or cancels the call ends at once (``broker.front.hangup``), freeing its
    wait slot.
    """

    name = "FetchAgentInbox"
    input_schema = schemas.FETCH_ARGUMENTS
    output_schema = schemas.INBOX

    def __init__(
        self, relay: Relay[AgentMessage], max_response_bytes: int = MAX_FETCH_RESPONSE_BYTES
    ) -> None:
        super().__init__(relay)
        self.max_wait_ms = int(relay.max_wait * 1000)
        self.max_response_bytes = max_response_bytes
        self.description = (
            f"Fetch up to `limit` (1-{MAX_FETCH_LIMIT}, default {DEFAULT_FETCH_LIMIT}) unacknowledged "
            "envelopes, oldest first. The same envelopes come back until you acknowledge them. With "
            f"wait_ms, wait up to that long (capped at {self.max_wait_ms} ms) for a message when the inbox "
            f"is empty. One result holds at most {max_response_bytes // 1024} KiB of envelopes (at least "
            "one): fewer than `limit` may come back while more are waiting."
        )

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        limit = arguments.get("limit", DEFAULT_FETCH_LIMIT)
        wait_ms = arguments.get("wait_ms")
        if wait_ms is not None and (isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0):
            raise InvalidArgument(
                "wait_ms", "wait_ms.range", f"must be a whole number of milliseconds, 0 to {self.max_wait_ms}"
            )
        # the relay caps the wait (max_wait); clamped here first only so a huge integer still converts
        wait = min(wait_ms, self.max_wait_ms) / 1000 if wait_ms else None
        fetching = self.relay.fetch(who.agent, limit, wait, session=who.session)
        # a parked fetch whose caller hung up or cancelled it gives its wait slot back at once
        got = await unless_abandoned(fetching, []) if wait else await fetching
        envelopes: list[dict[str, Any]] = []
        size = 0
        exact = False
        for envelope in got:
            item = self.inbox_envelope(envelope)
            if not exact:
                # encoding each envelope only to measure it cost a tenth of a fetch: the bound
                # decides while the response is far from full, the exact size once it may not be
                size += encoded_size_bound(envelope, item)
                if size > self.max_response_bytes:
                    exact = True
                    size = sum(map(encoded_size, envelopes))
            if exact:
                size += encoded_size(item)
            if envelopes and size > self.max_response_bytes:
                log.info(
                    "fetch cut to %d of %d envelopes (%d bytes at most per response)",
                    len(envelopes),
                    len(got),
                    self.max_response_bytes,
                    extra={"agent": who.agent},
                )
                got = got[: len(envelopes)]
                break
            envelopes.append(item)
        if log.isEnabledFor(logging.INFO):
            for envelope in got:
                if envelope.deliveries == 1:
                    log.info(
                        "delivered",
                        extra={
                            "envelope": envelope.id,
                            "from": envelope.sender,
                            "to": envelope.to,
                            "tier": envelope.tier.label,
                            "outcome": "ok",
                        },
                    )
        return tool_result({"envelopes": envelopes})

    def inbox_envelope(self, envelope: Envelope[AgentMessage]) -> dict[str, Any]:
        """One envelope of ``schemas.INBOX``; ``to_json`` gives ``kind``, ``text`` and only the
        optional fields that are set."""
        item = {
            "id": envelope.id,
            "from": envelope.sender,
            "tier": envelope.tier.label,
            "message": self.relay.contract.to_json(envelope.message),
            "sent_at": format_ms(envelope.sent_at_ms),
            "deliveries": envelope.deliveries,
        }
        if envelope.expires_at_ms is not None:
            item["expires_at"] = format_ms(envelope.expires_at_ms)
        return item


class AcknowledgeAgentInbox(RelayTool):
    """Acknowledge envelopes of the caller's inbox by id; unknown ids are reported, not refused."""

    name = "AcknowledgeAgentInbox"
    description = (
        "Acknowledge envelopes you have handled, by id; they will not come back. Unknown or already "
        "acknowledged ids are reported, not refused."
    )
    input_schema = schemas.ACKNOWLEDGE_ARGUMENTS
    output_schema = schemas.ACKNOWLEDGEMENT

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        done = await self.relay.ack(who.agent, arguments["ids"], session=who.session)
        if log.isEnabledFor(logging.INFO):
            for envelope_id, (sender, tier) in zip(done.acknowledged, done.origins, strict=False):
                log.info(
                    "acknowledged",
                    extra={
                        "envelope": envelope_id,
                        "from": sender,
                        "to": who.agent,
                        "tier": tier.label,
                        "outcome": "ok",
                    },
                )
        return tool_result({"acknowledged": list(done.acknowledged), "unknown": list(done.unknown)})


class GetMessageStatus(RelayTool):
    """What became of envelopes the caller sent; anything else reads ``unknown``."""

    name = "GetMessageStatus"
    description = (
        f"What became of messages you sent, by envelope id (1-{MAX_STATUS_IDS} ids): state queued (not yet "
        "handed out), delivered (handed out, not acknowledged; see deliveries), acknowledged, "
        "dead_lettered (see reason), expired, or unknown (not sent by you, or older than the status "
        "retention, 7 days by default)."
    )
    input_schema = schemas.STATUS_ARGUMENTS
    output_schema = schemas.STATUSES

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        statuses = await self.relay.status(who.agent, arguments["ids"], session=who.session)
        return tool_result(schemas.status_result(statuses))


class ListAgents(RelayTool):
    """The registered agents the caller may write to, by id, a bounded page at a time."""

    name = "ListAgents"
    description = (
        "List the registered agents you can send to: id, provider, tier, presence (live: its session "
        "gave a sign recently; gone: it did not) and when each was last seen, "
        f"ordered by id, up to `limit` (1-{schemas.MAX_LIST_AGENTS}, default {schemas.DEFAULT_LIST_AGENTS}) "
        "per call. When `next` is in the result, call again with after = next for the following page."
    )
    input_schema = schemas.LIST_AGENTS_ARGUMENTS
    output_schema = schemas.AGENTS

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        limit = arguments.get("limit", schemas.DEFAULT_LIST_AGENTS)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= schemas.MAX_LIST_AGENTS:
            raise InvalidArgument(
                "limit", "limit.range", f"must be an integer from 1 to {schemas.MAX_LIST_AGENTS}"
            )
        after = arguments.get("after")
        if after is not None:
            check_agent_id(after, "after")
        me = await self.relay.registration(who.agent)  # registered, from its current session
        if me is None:
            raise UnregisteredAgent(who.agent)
        me.check_session(who.session)
        found = await self.relay.registrations(limit + 1, after)
        return tool_result(schemas.agents_result(found[:limit], len(found) > limit, self.relay.clock()))


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """Which tools a front serves, and what they accept."""

    directory: bool = True
    """Serve ``ListAgents`` (``relay serve --directory off`` hides it)."""
    network: bool = False
    """Serve the network listener: ``RegisterAgentAddress`` takes network-tier addresses only."""
    webhooks: IWebhookTargets | None = None
    """Issues the secrets of webhook registrations (network listener)."""
    mail: IOperatorView | None = None
    """The histories ``SearchAgentMessages`` reads (served only when set)."""


DEFAULT_TOOLS: Final = ToolOptions()


def relay_tools(relay: Relay[AgentMessage], options: ToolOptions = DEFAULT_TOOLS) -> list[AgentTool]:
    """The agent tools over ``relay``."""
    tools: list[AgentTool] = [
        RegisterAgentAddress(relay, options),
        SendAgentMessage(relay),
        FetchAgentInbox(relay),
        AcknowledgeAgentInbox(relay),
        GetMessageStatus(relay),
    ]
    if options.directory:
        tools.append(ListAgents(relay))
    if options.mail is not None:
        # imported here: the search tool's module builds on AgentTool and RelayTool defined above
        from broker.front.mail_tool import SearchAgentMessages

        tools.append(SearchAgentMessages(relay, options.mail))
    return tools


def tool_result(data: dict[str, Any]) -> CallToolResult:
    """A success result: the data as structured content only. Clients of MCP 2025-06-18 and later read
    it there (the official Python SDK validates it against the output schema; Claude Code hands the
    model its JSON and ignores ``content`` when it is present), so the same JSON is not encoded a second
    time as text. ``broker.front.server.as_text`` gives older clients the text instead."""
    return CallToolResult(content=[], structured_content=data)


_JSON: Final = json.JSONEncoder(ensure_ascii=False)
"""= ``json.dumps(data, ensure_ascii=False)``; one encoder instead of a new one per call."""


def encoded_size(data: object) -> int:
    """Bytes of ``data`` as UTF-8 JSON (what it adds to a response body)."""
    text = _JSON.encode(data)
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


_ENVELOPE_FRAME: Final = 512
"""Bytes of an inbox envelope's JSON besides its id, sender and message strings, at most: its keys,
punctuation, tier, times and integers come to about 250."""


def encoded_size_bound(envelope: Envelope[AgentMessage], item: Mapping[str, Any]) -> int:
    """At least ``encoded_size(item)`` for ``item = inbox_envelope(envelope)``: a character of a JSON
    string takes at most 6 bytes (``\u0000``)."""
    message = item["message"]
    chars = len(envelope.id) + len(envelope.sender) + len(message["text"])
    chars += len(message.get("in_reply_to", "")) + len(message.get("reference", ""))
    return 6 * chars + _ENVELOPE_FRAME


def _string(arguments: Mapping[str, Any], name: str) -> str:
    value = arguments[name]
    if not isinstance(value, str):
        raise InvalidArgument(name, "type", f"must be a string, not {json_type(value)}")
    return value
