"""JSON schemas of the agent tools' arguments and results, shared by every front that exposes them (the
MCP endpoint, the Workbench session tools).

Written out by hand rather than generated from models: they are a public contract, so they should read
like one (no ``$defs`` indirection, no ``anyOf`` with ``null`` for fields that are simply optional).
``tests/test_schemas.py`` checks real tool results against the full result schemas, and that the argument
schemas refuse what the tools refuse.

The hot tools (send, fetch, acknowledge) publish the *shape* of their results as output schema
(``shape_of``: objects with their required fields, arrays, and every field's type in the description)
rather than a schema typing every leaf. MCP clients validate every result against the output schema;
the official Python client does it with ``jsonschema`` at about 5 µs per typed field, which for a fetch
of 16 envelopes was ~0.7 ms of client CPU per call (11 ms for 256), more than the relay's own work. The
server's side of the contract, every field's type, is held by the tests against the full schemas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from broker.agent_message import (
    IN_REPLY_TO_PATTERN,
    KIND_LABELS,
    MAX_REFERENCE_CHARS,
    MAX_TEXT_BYTES,
    MIN_REFERENCE_CHARS,
)
from broker.envelope import Envelope, Tier, format_ms, format_time
from broker.ids import AGENT_ID_PATTERN, ENVELOPE_ID_PATTERN, IDEMPOTENCY_KEY_PATTERN
from broker.limits import (
    DEFAULT_FETCH_LIMIT,
    MAX_ACK_IDS,
    MAX_FETCH_LIMIT,
    MAX_STATUS_IDS,
    MAX_TTL_MS,
    MIN_TTL_MS,
)
from broker.ports import STATES, MessageStatus, Registration
from broker.relay import Registered

AGENT_ID: Final[dict[str, Any]] = {"type": "string", "pattern": AGENT_ID_PATTERN}
ENVELOPE_ID: Final[dict[str, Any]] = {"type": "string", "pattern": ENVELOPE_ID_PATTERN}

_KINDS: Final = ", ".join(f"{number} {label}" for number, label in KIND_LABELS.items())
_REPLY: Final = next(number for number, label in KIND_LABELS.items() if label == "reply")

# The limits below are read from agent.proto's buf.validate options (broker.agent_message), so the
# published schema and the enforced rules cannot drift apart; UTF-8 byte counts have no JSON schema
# keyword, so the text's bound is in its description.
MESSAGE_IN: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A candace.agent.v1.AgentMessage: a proposal to the recipient, never permission to act.",
    "properties": {
        "kind": {
            "description": f"{_KINDS} (the names are accepted too)",
            "oneOf": [
                {"type": "integer", "enum": list(KIND_LABELS)},
                {"type": "string", "enum": list(KIND_LABELS.values())},
            ],
        },
        "text": {
            "type": "string",
            "minLength": 1,
            "description": f"The message, 1 to {MAX_TEXT_BYTES} bytes of UTF-8",
        },
        "in_reply_to": {
            "type": "string",
            "pattern": IN_REPLY_TO_PATTERN,
            "description": f"The envelope id this message answers; required when kind is {_REPLY} (reply)",
        },
        "reference": {
            "type": "string",
            "minLength": MIN_REFERENCE_CHARS,
            "maxLength": MAX_REFERENCE_CHARS,
            "description": "A pointer to related material (URL, path, id), "
            f"{MIN_REFERENCE_CHARS}-{MAX_REFERENCE_CHARS} characters",
        },
    },
    "required": ["kind", "text"],
    "additionalProperties": False,
}

MESSAGE_OUT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "kind": {"type": "integer", "description": _KINDS},
        "text": {"type": "string"},
        "in_reply_to": {"type": "string"},
        "reference": {"type": "string"},
    },
    "required": ["kind", "text"],
}

_TIME: Final[dict[str, Any]] = {"type": "string", "description": "UTC, RFC 3339 with milliseconds"}
_TIER: Final[dict[str, Any]] = {"type": "string", "enum": [tier.label for tier in Tier]}

# -- tool arguments -------------------------------------------------------------------------------

REGISTER_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "provider": {"type": "string", "description": "The address type: 'claudecode' here"},
        "endpoint": {
            "type": "string",
            "description": "'127.0.0.1:PORT', '[::1]:PORT', 'localhost:PORT' or 'unix:/absolute/path'",
        },
    },
    "required": ["provider", "endpoint"],
    "additionalProperties": False,
}

SEND_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "to": {**AGENT_ID, "description": "The recipient's agent id"},
        "message": MESSAGE_IN,
        "idempotency_key": {
            "type": "string",
            "pattern": IDEMPOTENCY_KEY_PATTERN,
            "description": "Optional, 1-128 of A-Z a-z 0-9 . _ : -. Sending again with the same key (within "
            "the dedup window, default 24 h) returns the first send's id and sent_at and stores nothing, "
            "also when the first attempt timed out; the same key with a different to, message or "
            "ttl_ms is refused (idempotency_conflict). Use one key per message and retry with it.",
        },
        "ttl_ms": {
            "type": "integer",
            "minimum": MIN_TTL_MS,
            "maximum": MAX_TTL_MS,
            "description": f"Optional: after this many milliseconds ({MIN_TTL_MS} to 30 days, or the relay's "
            "--max-ttl) the message expires: it is never handed out and moves to the recipient's dead "
            "letters with reason 'expired'",
        },
    },
    "required": ["to", "message"],
    "additionalProperties": False,
}

FETCH_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_FETCH_LIMIT,
            "default": DEFAULT_FETCH_LIMIT,
        },
        "wait_ms": {
            "type": ["integer", "null"],
            "minimum": 0,
            "description": "Wait up to this long for a message when the inbox is empty (capped)",
        },
    },
    "additionalProperties": False,
}

ACKNOWLEDGE_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"ids": {"type": "array", "items": ENVELOPE_ID, "maxItems": MAX_ACK_IDS}},
    "required": ["ids"],
    "additionalProperties": False,
}

MAX_LIST_AGENTS: Final = 200
"""Agents one ``ListAgents`` result holds at most."""
DEFAULT_LIST_AGENTS: Final = 50

LIST_AGENTS_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIST_AGENTS,
            "default": DEFAULT_LIST_AGENTS,
            "description": "Agents per page",
        },
        "after": {**AGENT_ID, "description": "The next page: the `next` of the previous result"},
    },
    "additionalProperties": False,
}

STATUS_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "ids": {
            "type": "array",
            "items": ENVELOPE_ID,
            "minItems": 1,
            "maxItems": MAX_STATUS_IDS,
            "description": "Envelope ids as SendAgentMessage returned them",
        }
    },
    "required": ["ids"],
    "additionalProperties": False,
}

# -- tool results ---------------------------------------------------------------------------------

REGISTRATION: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "agent": {"type": "string"},
        "session": {"type": "string"},
        "provider": {"type": "string"},
        "endpoint": {"type": "string"},
        "tier": _TIER,
        "registered_at": _TIME,
        "updated_at": _TIME,
        "superseded_session": {
            "type": "string",
            "description": "The session this registration replaced, when it replaced one",
        },
        "webhook_secret": {
            "type": "string",
            "description": "Network listener, https:// endpoint: the Standard Webhooks secret (whsec_...) "
            "mail-pending notifications to it are signed with; new on every registration",
        },
    },
    "required": ["agent", "session", "provider", "endpoint", "tier", "registered_at", "updated_at"],
}


AGENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "agents": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Send to it with SendAgentMessage's `to`"},
                    "provider": {"type": "string", "description": "e.g. claudecode (an agent), human"},
                    "tier": _TIER,
                    "last_seen": {**_TIME, "description": "Its last registration, fetch or acknowledgement"},
                },
                "required": ["id", "provider", "tier"],
            },
        },
        "next": {
            "type": "string",
            "description": "More agents: pass this as `after`; absent on the last page",
        },
    },
    "required": ["agents"],
}


def agents_result(registrations: Sequence[Registration], more: bool) -> dict[str, Any]:
    """The ``AGENTS`` result of one page of registrations; ``more``: another page follows."""
    agents: list[dict[str, Any]] = []
    for reg in registrations:
        item: dict[str, Any] = {"id": reg.agent, "provider": reg.provider, "tier": reg.tier.label}
        if reg.last_seen is not None:
            item["last_seen"] = format_time(reg.last_seen)
        agents.append(item)
    data: dict[str, Any] = {"agents": agents}
    if more and registrations:
        data["next"] = registrations[-1].agent
    return data


def registration_result(done: Registered) -> dict[str, Any]:
    """The ``REGISTRATION`` result of a registration, as every front returns it."""
    reg = done.registration
    data: dict[str, Any] = {
        "agent": reg.agent,
        "session": reg.session,
        "provider": reg.provider,
        "endpoint": reg.endpoint,
        "tier": reg.tier.label,
        "registered_at": format_time(reg.registered_at),
        "updated_at": format_time(reg.updated_at),
    }
    if done.superseded_session is not None:
        data["superseded_session"] = done.superseded_session
    return data


def sent_result(sent: Envelope[Any]) -> dict[str, Any]:
    """The ``SENT`` result of a send, as every front returns it."""
    return {"id": sent.id, "to": sent.to, "tier": sent.tier.label, "sent_at": format_time(sent.sent_at)}


SENT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The envelope id"},
        "to": {"type": "string"},
        "tier": _TIER,
        "sent_at": _TIME,
    },
    "required": ["id", "to", "tier", "sent_at"],
}

INBOX: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "envelopes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Acknowledge with it; answer with in_reply_to"},
                    "from": {"type": "string"},
                    "tier": _TIER,
                    "message": MESSAGE_OUT,
                    "sent_at": _TIME,
                    "deliveries": {"type": "integer", "description": "1 on the first hand-out"},
                    "expires_at": {
                        **_TIME,
                        "description": "When it expires unacknowledged (sent with ttl_ms)",
                    },
                },
                "required": ["id", "from", "tier", "message", "sent_at", "deliveries"],
            },
        }
    },
    "required": ["envelopes"],
}

ACKNOWLEDGEMENT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "acknowledged": {"type": "array", "items": {"type": "string"}},
        "unknown": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Ids that were not (or no longer) unacknowledged envelopes of yours",
        },
    },
    "required": ["acknowledged", "unknown"],
}

STATUSES: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "statuses": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "state": {
                        "type": "string",
                        "enum": list(STATES),
                        "description": "queued: not yet handed out; delivered: handed out, not "
                        "acknowledged; acknowledged; dead_lettered (see reason); expired; unknown: not "
                        "sent by you, or older than the status retention",
                    },
                    "to": {"type": "string"},
                    "deliveries": {"type": "integer", "description": "Hand-outs so far, when known"},
                    "sent_at": _TIME,
                    "reason": {
                        "type": "string",
                        "description": "Why it was dead-lettered: max_deliveries, expired, or the "
                        "receive loop's reason",
                    },
                },
                "required": ["id", "state"],
            },
        }
    },
    "required": ["statuses"],
}


def status_result(statuses: list[MessageStatus]) -> dict[str, Any]:
    """The ``STATUSES`` result: an unknown envelope is its id and state only."""
    out: list[dict[str, Any]] = []
    for status in statuses:
        item: dict[str, Any] = {"id": status.envelope_id, "state": status.state}
        if status.to is not None:
            item["to"] = status.to
        if status.deliveries is not None:
            item["deliveries"] = status.deliveries
        if status.sent_at_ms is not None:
            item["sent_at"] = format_ms(status.sent_at_ms)
        if status.reason is not None:
            item["reason"] = status.reason
        out.append(item)
    return {"statuses": out}


# -- what the tools publish -----------------------------------------------------------------------


def shape_of(schema: dict[str, Any]) -> dict[str, Any]:
    """The published form of a result schema: objects keep ``required`` and the arrays among their
    properties, arrays keep the shape of object items, and every dropped field is named with its type
    in the object's ``description``, so the schema still documents the whole result."""
    if schema.get("type") == "array":
        items = schema.get("items", {})
        shaped: dict[str, Any] = {"type": "array"}
        if items.get("type") == "object":
            shaped["items"] = shape_of(items)
        return shaped
    properties: dict[str, Any] = schema.get("properties", {})
    kept = {name: shape_of(sub) for name, sub in properties.items() if sub.get("type") == "array"}
    fields = ", ".join(f"{name} ({_type_name(sub)})" for name, sub in properties.items())
    description = f"{schema['description']} " if "description" in schema else ""
    shaped = {"type": "object", "description": f"{description}Fields: {fields}."}
    if kept:
        shaped["properties"] = kept
    if "required" in schema:
        shaped["required"] = list(schema["required"])
    return shaped


def _type_name(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items", {})
        return f"array of {_type_name(items)}" if items else "array"
    if kind == "object" and "properties" in schema:
        optional = [name for name in schema["properties"] if name not in schema.get("required", ())]
        inner = ", ".join(
            f"{name}{'?' if name in optional else ''}: {_type_name(sub)}"
            for name, sub in schema["properties"].items()
        )
        return f"object {{{inner}}}"
    if "enum" in schema:
        return " | ".join(str(value) for value in schema["enum"])
    return str(kind or "any")


SENT_SHAPE: Final = shape_of(SENT)
INBOX_SHAPE: Final = shape_of(INBOX)
ACKNOWLEDGEMENT_SHAPE: Final = shape_of(ACKNOWLEDGEMENT)
STATUSES_SHAPE: Final = shape_of(STATUSES)
