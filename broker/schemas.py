"""JSON schemas of the agent tools' arguments and results, shared by every front that exposes them (the
MCP endpoint, the Workbench session tools).

Written out by hand rather than generated from models: they are a public contract, so they should read
like one (no ``$defs`` indirection, no ``anyOf``: an optional field that may be ``null`` says so in its
``type``). ``tests/test_schemas.py`` checks real tool results against the result schemas, and that the
argument schemas refuse what the tools refuse and allow what they accept.

Every property is described, every object lists its properties and every array its items, in the
argument and the result schemas alike: the published schemas are the whole contract. What a schema
allows, the tool accepts: an optional argument may be ``null`` (absent), and a number JSON Schema
counts as an integer (``1.0``) is one (``integral``). The rules the schemas leave to their descriptions
are those of several fields or of the store (a reply names ``in_reply_to``; a text's size in UTF-8
bytes; an endpoint's shape; a recipient being registered): model APIs that read these schemas take
plain keywords only (no ``if``/``then``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from broker.agent_message import (
    IN_REPLY_TO_PATTERN,
    KIND_LABELS,
    MAX_REFERENCE_CHARS,
    MAX_TEXT_BYTES,
    MIN_REFERENCE_CHARS,
)
from broker.envelope import Envelope, Tier, format_ms
from broker.ids import AGENT_ID_PATTERN, ENVELOPE_ID_PATTERN, IDEMPOTENCY_KEY_PATTERN
from broker.limits import (
    DEFAULT_FETCH_LIMIT,
    MAX_ACK_IDS,
    MAX_FETCH_LIMIT,
    MAX_STATUS_IDS,
    MAX_TTL_MS,
    MIN_TTL_MS,
)
from broker.ports import HISTORY_OUTCOMES, STATES, MessageStatus, Registration
from broker.presence import PRESENCE_WINDOW_MS, PRESENCES, presence
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
            "type": ["string", "null"],
            "pattern": IN_REPLY_TO_PATTERN,
            "description": f"The envelope id this message answers; required when kind is {_REPLY} (reply)",
        },
        "reference": {
            "type": ["string", "null"],
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
    "description": "The message as its sender sent it (optional fields only when set)",
    "properties": {
        "kind": {"type": "integer", "description": _KINDS},
        "text": {"type": "string", "description": "The message"},
        "in_reply_to": {"type": "string", "description": "The envelope id this message answers"},
        "reference": {"type": "string", "description": "A pointer to related material (URL, path, id)"},
    },
    "required": ["kind", "text"],
}

_TIME: Final[dict[str, Any]] = {"type": "string", "description": "UTC, RFC 3339 with milliseconds"}
_TIER: Final[dict[str, Any]] = {
    "type": "string",
    "enum": [tier.label for tier in Tier],
    "description": "in_process (one process), host (this machine) or network (another machine)",
}


def _at(what: str) -> dict[str, Any]:
    """A time property: ``what`` happened then (UTC, RFC 3339 with milliseconds)."""
    return {**_TIME, "description": f"{what} (UTC, RFC 3339 with milliseconds)"}


# -- tool arguments -------------------------------------------------------------------------------

HOST_ENDPOINTS: Final = "'127.0.0.1:PORT', '[::1]:PORT', 'localhost:PORT' or 'unix:/absolute/path'"
NETWORK_ENDPOINTS: Final = (
    "An https:// URL (signed mail-pending notifications are POSTed there) or a non-loopback 'host:port'; "
    "IP addresses in their usual form only (127.0.0.1, not 0177.0.0.1 or 127.1)"
)


def register_arguments(providers: Sequence[str], endpoints: str) -> dict[str, Any]:
    """The arguments of ``RegisterAgentAddress`` on a front that takes ``providers``, whose endpoints
    ``endpoints`` describes."""
    return {
        "type": "object",
        "properties": {
            "provider": {
                "type": "string",
                "enum": list(providers),
                "description": f"The address type: {', '.join(repr(p) for p in providers)} here",
            },
            "endpoint": {"type": "string", "description": f"Where you can be reached: {endpoints}"},
        },
        "required": ["provider", "endpoint"],
        "additionalProperties": False,
    }


REGISTER_ARGUMENTS: Final = register_arguments(["claudecode"], HOST_ENDPOINTS)
"""``register_arguments`` of the loopback listener's agent endpoint."""

SEND_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "to": {**AGENT_ID, "description": "The recipient's agent id"},
        "message": MESSAGE_IN,
        "idempotency_key": {
            "type": ["string", "null"],
            "pattern": IDEMPOTENCY_KEY_PATTERN,
            "description": "Optional, 1-128 of A-Z a-z 0-9 . _ : -. Sending again with the same key (within "
            "the dedup window, default 24 h) returns the first send's id and sent_at and stores nothing, "
            "also when the first attempt timed out; the same key with a different to, message or "
            "ttl_ms is refused (idempotency_conflict). Use one key per message and retry with it.",
        },
        "ttl_ms": {
            "type": ["integer", "null"],
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
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_FETCH_LIMIT,
            "default": DEFAULT_FETCH_LIMIT,
            "description": "Envelopes at most in this result",
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
    "properties": {
        "ids": {
            "type": "array",
            "items": ENVELOPE_ID,
            "maxItems": MAX_ACK_IDS,
            "description": f"Ids of envelopes FetchAgentInbox gave you (at most {MAX_ACK_IDS})",
        }
    },
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
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_LIST_AGENTS,
            "default": DEFAULT_LIST_AGENTS,
            "description": "Agents per page",
        },
        "after": {
            **AGENT_ID,
            "type": ["string", "null"],
            "description": "The next page: the `next` of the previous result",
        },
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

MAX_SEARCH_RESULTS: Final = 100
"""Messages one ``SearchAgentMessages`` result holds at most."""
DEFAULT_SEARCH_RESULTS: Final = 20
MAX_SEARCH_QUERY: Final = 200
"""Characters of a ``SearchAgentMessages`` query at most."""

SEARCH_ARGUMENTS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "query": {
            "type": ["string", "null"],
            "maxLength": MAX_SEARCH_QUERY,
            "description": "Words the text must all hold (any case, any order); absent: every message",
        },
        "with": {
            **AGENT_ID,
            "type": ["string", "null"],
            "description": "Only mail exchanged with this agent",
        },
        "since": {
            **_TIME,
            "type": ["string", "null"],
            "description": "Left the inbox at or after (RFC 3339)",
        },
        "until": {
            **_TIME,
            "type": ["string", "null"],
            "description": "Left the inbox at or before (RFC 3339)",
        },
        "thread": {
            **ENVELOPE_ID,
            "type": ["string", "null"],
            "description": "Only the thread of this envelope (what it answers and every answer to it)",
        },
        "limit": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_SEARCH_RESULTS,
            "default": DEFAULT_SEARCH_RESULTS,
            "description": "Messages per page",
        },
        "cursor": {
            "type": ["string", "null"],
            "maxLength": 120,
            "description": "The `next` of the previous page",
        },
    },
    "additionalProperties": False,
}

# -- tool results ---------------------------------------------------------------------------------

REGISTRATION: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "description": "Your agent id (from your token)"},
        "session": {"type": "string", "description": "The session registered (from your headers)"},
        "provider": {"type": "string", "description": "The address type registered"},
        "endpoint": {"type": "string", "description": "Where you are reached"},
        "tier": _TIER,
        "registered_at": _at("The agent's first registration"),
        "updated_at": _at("This registration"),
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
            "description": "Registered agents, ordered by id",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Send to it with SendAgentMessage's `to`"},
                    "provider": {"type": "string", "description": "e.g. claudecode (an agent), human"},
                    "tier": _TIER,
                    "presence": {
                        "type": "string",
                        "enum": list(PRESENCES),
                        "description": "live: its session gave a sign (a call, a parked wait, its "
                        f"webhook answering) within the last {PRESENCE_WINDOW_MS // 1000} s; gone: none",
                    },
                    "last_seen": _at(
                        "Its last sign: registration, fetch, acknowledgement, mail-pending wait, "
                        "webhook taken"
                    ),
                },
                "required": ["id", "provider", "tier", "presence"],
            },
        },
        "next": {
            "type": "string",
            "description": "More agents: pass this as `after`; absent on the last page",
        },
    },
    "required": ["agents"],
}


def agents_result(registrations: Sequence[Registration], more: bool, now_ms: int) -> dict[str, Any]:
    """The ``AGENTS`` result of one page of registrations; ``more``: another page follows; ``now_ms``:
    the clock presence is judged by."""
    agents: list[dict[str, Any]] = []
    for reg in registrations:
        item: dict[str, Any] = {
            "id": reg.agent,
            "provider": reg.provider,
            "tier": reg.tier.label,
            "presence": presence(reg.last_seen_ms, now_ms, reg.ended_at_ms),
        }
        if reg.last_seen_ms is not None:
            item["last_seen"] = format_ms(reg.last_seen_ms)
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
        "registered_at": format_ms(reg.registered_at_ms),
        "updated_at": format_ms(reg.updated_at_ms),
    }
    if done.superseded_session is not None:
        data["superseded_session"] = done.superseded_session
    return data


def sent_result(sent: Envelope[Any]) -> dict[str, Any]:
    """The ``SENT`` result of a send, as every front returns it."""
    return {"id": sent.id, "to": sent.to, "tier": sent.tier.label, "sent_at": format_ms(sent.sent_at_ms)}


SENT: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The envelope id: follow it with GetMessageStatus"},
        "to": {"type": "string", "description": "The recipient"},
        "tier": _TIER,
        "sent_at": _at("Accepted"),
    },
    "required": ["id", "to", "tier", "sent_at"],
}

INBOX: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "envelopes": {
            "type": "array",
            "description": "Unacknowledged envelopes, oldest first",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Acknowledge with it; answer with in_reply_to"},
                    "from": {"type": "string", "description": "The sender's agent id"},
                    "tier": _TIER,
                    "message": MESSAGE_OUT,
                    "sent_at": _at("Accepted"),
                    "deliveries": {"type": "integer", "description": "1 on the first hand-out"},
                    "expires_at": _at("When it expires unacknowledged (sent with ttl_ms)"),
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
        "acknowledged": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Ids acknowledged now: they will not come back",
        },
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
            "description": "One per id asked about, in that order",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The envelope id asked about"},
                    "state": {
                        "type": "string",
                        "enum": list(STATES),
                        "description": "queued: not yet handed out; delivered: handed out, not "
                        "acknowledged; acknowledged; dead_lettered (see reason); expired; unknown: not "
                        "sent by you, or older than the status retention",
                    },
                    "to": {"type": "string", "description": "The recipient"},
                    "deliveries": {"type": "integer", "description": "Hand-outs so far, when known"},
                    "sent_at": _at("Accepted"),
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


# -- what the tools accept -------------------------------------------------------------------------


_NUMBER_HOLDERS: Final = (float, dict, list)
"""What ``integral`` looks into (a tuple: ``isinstance`` takes it faster than ``float | dict | list``)."""


def integral(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with every number JSON Schema counts as an integer (``1.0``) an ``int`` where
    ``schema`` types it ``integer``: JSON decoders keep ``1.0`` a float, which the tools would refuse.
    Returns ``value`` itself when nothing changes (the common case costs a few type checks)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and _integer(schema) else value
    if isinstance(value, dict):
        properties = schema.get("properties")
        if not properties:
            return value
        changed: dict[str, Any] | None = None
        for name, item in value.items():
            sub = properties.get(name)
            if sub is not None and isinstance(item, _NUMBER_HOLDERS):
                new = integral(sub, item)
                if new is not item:
                    changed = changed if changed is not None else dict(value)
                    changed[name] = new
        return value if changed is None else changed
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        changed_items: list[Any] | None = None
        for index, item in enumerate(value):
            if isinstance(item, _NUMBER_HOLDERS):  # a string (an id) holds no number: skipped
                new = integral(items, item)
                if new is not item:
                    changed_items = changed_items if changed_items is not None else list(value)
                    changed_items[index] = new
        return value if changed_items is None else changed_items
    return value


def _integer(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        return True
    return any(_integer(branch) for branch in schema.get("oneOf", ()))


MAIL: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "messages": {
            "type": "array",
            "description": "Mail you sent or received that left its recipient's inbox, oldest first",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The envelope id"},
                    "from": {"type": "string", "description": "The sender's agent id"},
                    "to": {"type": "string", "description": "The recipient's agent id"},
                    "message": MESSAGE_OUT,
                    "sent_at": _at("Accepted"),
                    "outcome": {
                        "type": "string",
                        "enum": list(HISTORY_OUTCOMES),
                        "description": "How it left the recipient's inbox",
                    },
                    "left_at": _at("When it left the recipient's inbox"),
                },
                "required": ["id", "from", "to", "message", "sent_at", "outcome", "left_at"],
            },
        },
        "next": {"type": "string", "description": "Present when there is more: pass it as cursor"},
    },
    "required": ["messages"],
}
