"""The relay's message body: ``candace.agent.v1.AgentMessage`` and its contract.

The schema and every refinement live in ``proto/candace/agent/v1/agent.proto`` as protovalidate
(``buf.validate``) annotations; this module only enforces them and encodes the message:

* ``validate`` runs the proto's rules through one shared ``protovalidate.Validator`` and reports *all*
  violations as a ``ContractViolation`` (field path, rule id, message; '' is the message itself).
* ``to_fields`` / ``from_fields``: flat, human-readable strings for a Redis hash
  (``kind=reply text=... in_reply_to=env_...``).
* ``to_json`` / ``from_json``: plain JSON data for the MCP tools. ``from_json`` checks the *shape*
  only (object, known keys, types); the relay calls ``validate`` for the refinements.

Match violations on ``rule`` (protovalidate's rule id, or one of the shape rules below), never on the
message text, which is library wording.

Shape rules raised here (not by protovalidate):

========================  ===============================================================
``type``                  wrong JSON type (not an object, ``kind`` not an int or name, ...)
``unknown_field``         a key the contract does not define
``enum.name``             ``kind`` is a string that names no ``Kind``
``range``                 ``kind`` is an integer outside int32
``utf8``                  a string that cannot be encoded as UTF-8 (lone surrogate)
``fields``                a stored field set that does not describe a message (corrupt entry)
========================  ===============================================================
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Final

import protovalidate

from broker._gen.buf.validate import validate_pb2
from broker._gen.candace.agent.v1.agent_pb2 import AgentMessage, Kind
from broker.contract import RESERVED_FIELDS
from broker.errors import ContractViolation, Violation, json_type
from broker.text import encodable

__all__ = [
    "IN_REPLY_TO_PATTERN",
    "KIND_LABELS",
    "MAX_REFERENCE_CHARS",
    "MAX_TEXT_BYTES",
    "MIN_REFERENCE_CHARS",
    "AgentMessage",
    "AgentMessageContract",
    "Kind",
]

_VALIDATOR: Final = protovalidate.Validator()
"""The one validator: it caches the compiled rules per message type (5-16 ms to build), so never make
one per call."""

# -- the rules, read from the proto's buf.validate options (the one place they are written) ----------


def _field_rules(name: str) -> validate_pb2.FieldRules:
    rules: validate_pb2.FieldRules = (
        AgentMessage.DESCRIPTOR.fields_by_name[name].GetOptions().Extensions[validate_pb2.field]
    )
    return rules


KIND_LABELS: Final[Mapping[int, str]] = {
    number: name.removeprefix("KIND_").lower()
    for name, number in Kind.items()
    if number != Kind.KIND_UNSPECIFIED
}
"""The name of every defined, non-zero ``Kind``: its enum name without ``KIND_``, lowercase. The one
spelling of a kind in JSON (``"kind": "request"`` or ``2``), in Redis fields and in prompts."""
MAX_TEXT_BYTES: Final = _field_rules("text").string.max_bytes
"""``text``: required, at most this many bytes of UTF-8."""
IN_REPLY_TO_PATTERN: Final = _field_rules("in_reply_to").string.pattern
"""``in_reply_to``, when set: an envelope id."""
MIN_REFERENCE_CHARS: Final = _field_rules("reference").string.min_len
MAX_REFERENCE_CHARS: Final = _field_rules("reference").string.max_len
"""``reference``, when set: from ``MIN_REFERENCE_CHARS`` to this many characters."""

_KIND_BY_LABEL: Final[Mapping[str, Kind.ValueType]] = {
    label: Kind.ValueType(number) for number, label in KIND_LABELS.items()
}
_KIND_RANGE: Final = f"{min(KIND_LABELS)}-{max(KIND_LABELS)}"
_KIND_HINT: Final = f"use {_KIND_RANGE} or one of {list(_KIND_BY_LABEL)}"

_UNSPECIFIED: Final = Kind.KIND_UNSPECIFIED  # (attribute reads on a protobuf enum wrapper are slow)
_FIELD_NAMES: Final = frozenset({"kind", "text", "in_reply_to", "reference"})
_OPTIONAL: Final = ("in_reply_to", "reference")
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


class AgentMessageContract:
    """``Contract[AgentMessage]``: validation and encodings of ``candace.agent.v1.AgentMessage``.

    Stateless; one instance can be shared by every task.
    """

    __slots__ = ()

    @property
    def type_name(self) -> str:
        return AgentMessage.DESCRIPTOR.full_name

    def validate(self, body: AgentMessage) -> None:
        """Check every rule of agent.proto; raise ``ContractViolation`` listing all that fail."""
        if _RULES_PINNED and type(body) is AgentMessage and _passes_pinned_rules(body):
            return
        try:
            _VALIDATOR.validate(body)
        except protovalidate.ValidationError as exc:
            raise ContractViolation([_from_protovalidate(v) for v in exc.violations]) from None

    def to_fields(self, body: AgentMessage) -> dict[str, str]:
        label = KIND_LABELS.get(body.kind)
        if label is None:
            raise ContractViolation(
                [Violation("kind", "enum.defined_only", f"kind {body.kind} has no field encoding")]
            )
        fields = {"kind": label, "text": body.text}
        if body.HasField("in_reply_to"):
            fields["in_reply_to"] = body.in_reply_to
        if body.HasField("reference"):
            fields["reference"] = body.reference
        return fields

    def from_fields(self, fields: Mapping[str, str]) -> AgentMessage:
        """Inverse of ``to_fields``. Envelope fields (``RESERVED_FIELDS``) are ignored if present."""
        label = fields.get("kind")
        kind = _KIND_BY_LABEL.get(label) if isinstance(label, str) else None
        if (
            kind is not None
            and "text" in fields
            and fields.keys() <= _FIELD_NAMES
            and all(isinstance(value, str) for value in fields.values())
        ):  # the usual case, exactly what the checks below accept when they find no problem
            return _stored_message(kind, fields["text"], fields)
        problems: list[Violation] = []
        for key, value in fields.items():
            if key in RESERVED_FIELDS:
                continue
            if key not in _FIELD_NAMES:
                problems.append(Violation(key, "fields", f"unexpected stored field {key!r}"))
            elif not isinstance(value, str):
                problems.append(Violation(key, "fields", f"stored field {key!r} is not a string"))
        label = fields.get("kind")
        kind = _KIND_BY_LABEL.get(label) if isinstance(label, str) else None
        if kind is None:
            problems.append(
                Violation("kind", "fields", f"stored kind {label!r} is not one of {sorted(_KIND_BY_LABEL)}")
            )
        text = fields.get("text")
        if text is None:
            problems.append(Violation("text", "fields", "stored message has no text field"))
        if problems or kind is None or text is None:
            raise ContractViolation(problems)
        return _stored_message(kind, text, fields)

    def to_json(self, body: AgentMessage) -> dict[str, object]:
        data: dict[str, object] = {"kind": int(body.kind), "text": body.text}
        if body.HasField("in_reply_to"):
            data["in_reply_to"] = body.in_reply_to
        if body.HasField("reference"):
            data["reference"] = body.reference
        return data

    def from_json(self, data: object) -> AgentMessage:
        """Build a message from JSON data, checking its shape only (``validate`` checks the rules).

        ``kind`` is an integer (any int32; undefined values are refused later by ``validate``) or one
        of the ``KIND_LABELS`` names, exactly as written there (``"request"``). ``text`` is a string;
        ``in_reply_to`` and ``reference`` are strings, and ``null`` means absent. Missing fields take
        their proto defaults, which ``validate`` then refuses where they are required.
        """
        if not isinstance(data, dict):
            raise ContractViolation(
                [Violation("", "type", f"message must be a JSON object, not {json_type(data)}")]
            )
        problems: list[Violation] = []
        kind = _UNSPECIFIED
        strings: dict[str, str] = {}
        for key, value in data.items():
            if key == "kind":
                parsed = _parse_kind(value, problems)
                if parsed is not None:
                    kind = parsed
            elif key in _FIELD_NAMES:
                if value is None and key in _OPTIONAL:
                    continue
                if not isinstance(value, str):
                    expected = "a string or null" if key in _OPTIONAL else "a string"
                    problems.append(Violation(key, "type", f"must be {expected}, not {json_type(value)}"))
                elif not encodable(value):
                    problems.append(Violation(key, "utf8", "must be valid Unicode (no lone surrogates)"))
                else:
                    strings[key] = value
            else:
                field = key if isinstance(key, str) else repr(key)
                problems.append(
                    Violation(
                        field, "unknown_field", f"unknown field {field!r}; expected {sorted(_FIELD_NAMES)}"
                    )
                )
        if problems:
            raise ContractViolation(problems)
        return AgentMessage(kind=kind, **strings)


# -- validation fast path -----------------------------------------------------------------------------
# protovalidate costs ~4 us (~34 000 instructions) per message, a tenth of a send's CPU. For the exact
# agent.proto this module was written against (pinned by the digest of its compiled descriptor), the
# rules are few and simple, and _passes_pinned_rules accepts exactly the messages that satisfy them.
# Anything it does not accept goes to protovalidate, which decides and words every violation, so a
# refusal is always protovalidate's. After any change to agent.proto the digest no longer matches and
# every message goes to protovalidate until _passes_pinned_rules is checked against the new rules and
# _PINNED_DESCRIPTOR updated.

_PINNED_DESCRIPTOR: Final = "2755c259fb3aa52acb500e6b933c01df437260df983c878d3396bcf1e3d3000f"
_RULES_PINNED: Final = (
    hashlib.sha256(AgentMessage.DESCRIPTOR.file.serialized_pb).hexdigest() == _PINNED_DESCRIPTOR
)
_IN_REPLY_TO: Final = re.compile(IN_REPLY_TO_PATTERN)
_REPLY: Final = Kind.KIND_REPLY
_MAX_KIND: Final = max(KIND_LABELS)


def _passes_pinned_rules(body: AgentMessage) -> bool:
    """True when ``body`` satisfies every rule of the pinned agent.proto (see above)."""
    kind = body.kind
    if not 1 <= kind <= _MAX_KIND:  # kind: required (not 0) and defined_only (the kinds are 0..max)
        return False
    text = body.text  # text: required (non-empty), at most MAX_TEXT_BYTES of UTF-8 (4 per character at most)
    if not text or (len(text) > MAX_TEXT_BYTES // 4 and len(text.encode()) > MAX_TEXT_BYTES):
        return False
    if body.HasField("in_reply_to"):  # the pattern when set (fullmatch: `$` must not pass a final "\n")
        if _IN_REPLY_TO.fullmatch(body.in_reply_to) is None:
            return False
    elif kind == _REPLY:  # agent_message.reply_requires_in_reply_to: this.kind != 3 || has(in_reply_to)
        return False
    if body.HasField("reference"):  # min_len to max_len characters when set
        return MIN_REFERENCE_CHARS <= len(body.reference) <= MAX_REFERENCE_CHARS
    return True


def _stored_message(kind: Kind.ValueType, text: str, fields: Mapping[str, str]) -> AgentMessage:
    message = AgentMessage(kind=kind, text=text)
    in_reply_to = fields.get("in_reply_to")
    if in_reply_to is not None:
        message.in_reply_to = in_reply_to
    reference = fields.get("reference")
    if reference is not None:
        message.reference = reference
    return message


def _parse_kind(value: object, problems: list[Violation]) -> Kind.ValueType | None:
    # bool is an int subclass: `true` must not mean KIND_NOTE.
    if isinstance(value, int) and not isinstance(value, bool):
        if _INT32_MIN <= value <= _INT32_MAX:
            return Kind.ValueType(value)
        problems.append(Violation("kind", "range", f"kind {value} is outside the int32 range"))
        return None
    if isinstance(value, str):
        kind = _KIND_BY_LABEL.get(value)
        if kind is None:
            problems.append(
                Violation(
                    "kind",
                    "enum.name",
                    f"unknown kind {value[:64]!r}; {_KIND_HINT}",
                )
            )
        return kind
    problems.append(
        Violation("kind", "type", f"must be an integer or a kind name, not {json_type(value)}; {_KIND_HINT}")
    )
    return None


def _from_protovalidate(violation: protovalidate.Violation) -> Violation:
    proto = violation.proto
    path = proto.field
    field = "" if path is None else ".".join(element.field_name or "" for element in path.elements)
    message = proto.message or ""
    if field == "kind":  # an undefined or missing kind: name the ones that exist, as for a bad name
        message = f"{message}; {_KIND_HINT}"
    return Violation(field, proto.rule_id or "", message)
