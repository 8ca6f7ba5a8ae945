"""The AgentMessage contract: every rule of agent.proto, and the field and JSON encodings."""

from __future__ import annotations

import json
from typing import Any

import protovalidate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker.agent_message as agent_message_module
from broker._gen.buf.validate import validate_pb2
from broker.agent_message import KIND_LABELS, AgentMessage, AgentMessageContract, Kind
from broker.contract import RESERVED_FIELDS, Contract
from broker.errors import ContractViolation
from broker.ids import ENVELOPE_ID_PATTERN, encode_envelope_id, new_nonce

CONTRACT = AgentMessageContract()
ENVELOPE_ID = encode_envelope_id(1_764_423_912_345, 7, "ABCDEFGHJK")
REPLY_RULE = "agent_message.reply_requires_in_reply_to"
DEFINED_KINDS = [Kind.ValueType(n) for n in Kind.values() if n != Kind.KIND_UNSPECIFIED]


def message(
    kind: int = Kind.KIND_NOTE,
    text: str = "hello",
    in_reply_to: str | None = None,
    reference: str | None = None,
) -> AgentMessage:
    """A message with the given fields; optional fields are set only when not None."""
    msg = AgentMessage(kind=Kind.ValueType(kind), text=text)
    if in_reply_to is not None:
        msg.in_reply_to = in_reply_to
    if reference is not None:
        msg.reference = reference
    return msg


def broken_rules(body: AgentMessage) -> set[tuple[str, str]]:
    """The (field, rule) pairs ``validate`` reports; empty if the message is valid."""
    try:
        CONTRACT.validate(body)
    except ContractViolation as exc:
        pairs = [(v.field, v.rule) for v in exc.violations]
        assert len(pairs) == len(set(pairs)), f"duplicate violations: {pairs}"
        return set(pairs)
    return set()


def shape_errors(data: object) -> set[tuple[str, str]]:
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.from_json(data)
    return {(v.field, v.rule) for v in caught.value.violations}


def test_implements_the_contract_protocol() -> None:
    contract: Contract[AgentMessage] = CONTRACT
    assert contract.type_name == "candace.agent.v1.AgentMessage"


# --- rules -----------------------------------------------------------------------------------------


def test_a_minimal_note_is_valid() -> None:
    assert broken_rules(message()) == set()


def test_empty_message_lists_kind_and_text() -> None:
    assert broken_rules(AgentMessage()) == {("kind", "required"), ("text", "required")}


def test_kind_zero_is_required() -> None:
    assert broken_rules(message(kind=0)) == {("kind", "required")}


@pytest.mark.parametrize("kind", [5, 99, -1, 2**31 - 1])
def test_undefined_kind_is_refused(kind: int) -> None:
    assert broken_rules(message(kind=kind)) == {("kind", "enum.defined_only")}


@pytest.mark.parametrize("kind", DEFINED_KINDS, ids=lambda k: Kind.Name(k))
def test_every_defined_kind_can_be_valid(kind: Kind.ValueType) -> None:
    """Guards the message-level CEL rule: cel-cpp fails *every* message if the rule names an enum
    constant, so each Kind (including any added later) must validate at runtime."""
    in_reply_to = ENVELOPE_ID if kind == Kind.KIND_REPLY else None
    assert broken_rules(message(kind=kind, in_reply_to=in_reply_to)) == set()


def test_every_defined_kind_has_a_field_label() -> None:
    assert set(KIND_LABELS) == set(DEFINED_KINDS)
    assert set(KIND_LABELS.values()) == {"note", "request", "reply", "status"}


def test_empty_text_is_required() -> None:
    assert broken_rules(message(text="")) == {("text", "required")}


def test_whitespace_text_is_not_empty() -> None:
    assert broken_rules(message(text=" ")) == set()


def test_text_of_65536_bytes_is_valid() -> None:
    assert broken_rules(message(text="a" * 65536)) == set()


def test_text_of_65537_bytes_is_refused() -> None:
    assert broken_rules(message(text="a" * 65537)) == {("text", "string.max_bytes")}


def test_text_bound_counts_utf8_bytes_not_characters() -> None:
    euro = "\u20ac"  # 3 bytes in UTF-8
    assert broken_rules(message(text=euro * 21845 + "a")) == set()  # 65536 bytes
    assert broken_rules(message(text=euro * 21846)) == {("text", "string.max_bytes")}  # 65538 bytes
    assert broken_rules(message(text="\U0001f600" * 16385)) == {("text", "string.max_bytes")}


def test_reply_without_in_reply_to_is_refused_at_message_level() -> None:
    assert broken_rules(message(kind=Kind.KIND_REPLY)) == {("", REPLY_RULE)}


def test_reply_with_in_reply_to_is_valid() -> None:
    assert broken_rules(message(kind=Kind.KIND_REPLY, in_reply_to=ENVELOPE_ID)) == set()


@pytest.mark.parametrize("kind", [Kind.KIND_NOTE, Kind.KIND_REQUEST, Kind.KIND_STATUS])
def test_other_kinds_may_carry_in_reply_to(kind: Kind.ValueType) -> None:
    assert broken_rules(message(kind=kind, in_reply_to=ENVELOPE_ID)) == set()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "env_",
        "env_123",
        ENVELOPE_ID.lower(),
        ENVELOPE_ID[4:],
        ENVELOPE_ID + "0",
        ENVELOPE_ID[:-1],
        "env_" + "I" * 26,
        "env_" + "L" * 26,
        "env_" + "O" * 26,
        "env_" + "U" * 26,
        " " + ENVELOPE_ID,
        ENVELOPE_ID + "\n",
        "msg_" + ENVELOPE_ID[4:],
    ],
)
def test_malformed_in_reply_to_is_refused(value: str) -> None:
    assert broken_rules(message(in_reply_to=value)) == {("in_reply_to", "string.pattern")}


def test_empty_in_reply_to_counts_as_present_for_a_reply() -> None:
    """An explicit "" satisfies has(), so only the pattern rule fires."""
    assert broken_rules(message(kind=Kind.KIND_REPLY, in_reply_to="")) == {("in_reply_to", "string.pattern")}


def test_relay_envelope_ids_are_accepted() -> None:
    for ms, seq in [(0, 0), (1_764_423_912_345, 0), (2**50 - 1, 32**6 - 1)]:
        envelope_id = encode_envelope_id(ms, seq, new_nonce())
        assert broken_rules(message(kind=Kind.KIND_REPLY, in_reply_to=envelope_id)) == set()


def test_in_reply_to_pattern_is_the_relay_envelope_id_pattern() -> None:
    options = AgentMessage.DESCRIPTOR.fields_by_name["in_reply_to"].GetOptions()
    assert options.Extensions[validate_pb2.field].string.pattern == ENVELOPE_ID_PATTERN


def test_empty_reference_is_refused() -> None:
    assert broken_rules(message(reference="")) == {("reference", "string.min_len")}


def test_reference_of_2048_characters_is_valid() -> None:
    assert broken_rules(message(reference="r" * 2048)) == set()
    assert broken_rules(message(reference="\u20ac" * 2048)) == set()  # characters, not bytes


def test_reference_of_2049_characters_is_refused() -> None:
    assert broken_rules(message(reference="r" * 2049)) == {("reference", "string.max_len")}


def test_violations_list_every_problem_with_field_and_rule() -> None:
    body = message(kind=99, text="a" * 65537, in_reply_to="nope", reference="")
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.validate(body)
    exc = caught.value
    assert {(v.field, v.rule) for v in exc.violations} == {
        ("kind", "enum.defined_only"),
        ("text", "string.max_bytes"),
        ("in_reply_to", "string.pattern"),
        ("reference", "string.min_len"),
    }
    assert all(v.message for v in exc.violations)
    assert exc.code == "contract_violation"
    details = exc.details()
    assert isinstance(details["violations"], list)
    assert len(details["violations"]) == 4
    assert all(set(d) == {"field", "rule", "message"} for d in details["violations"])


def test_message_level_and_field_violations_are_reported_together() -> None:
    assert broken_rules(message(kind=Kind.KIND_REPLY, text="")) == {("", REPLY_RULE), ("text", "required")}


def test_validate_uses_the_module_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a Validator per call would recompile the rules (milliseconds) on every message."""
    assert isinstance(agent_message_module._VALIDATOR, protovalidate.Validator)

    def no_new_validators(*args: object, **kwargs: object) -> None:
        raise AssertionError("validate() must reuse the module-level Validator")

    monkeypatch.setattr(protovalidate, "Validator", no_new_validators)
    CONTRACT.validate(message())
    assert broken_rules(AgentMessage()) == {("kind", "required"), ("text", "required")}


# --- fields (Redis) ----------------------------------------------------------------------------------


def test_to_fields_of_a_minimal_message() -> None:
    assert CONTRACT.to_fields(message(kind=Kind.KIND_REQUEST, text="do it")) == {
        "kind": "request",
        "text": "do it",
    }


def test_to_fields_of_a_full_message() -> None:
    body = message(kind=Kind.KIND_REPLY, text="done", in_reply_to=ENVELOPE_ID, reference="https://x/1")
    assert CONTRACT.to_fields(body) == {
        "kind": "reply",
        "text": "done",
        "in_reply_to": ENVELOPE_ID,
        "reference": "https://x/1",
    }


@pytest.mark.parametrize("kind", DEFINED_KINDS, ids=lambda k: Kind.Name(k))
def test_fields_round_trip_every_kind(kind: Kind.ValueType) -> None:
    body = message(kind=kind, text="t", in_reply_to=ENVELOPE_ID, reference="ref")
    fields = CONTRACT.to_fields(body)
    assert RESERVED_FIELDS.isdisjoint(fields)
    assert all(isinstance(v, str) for v in fields.values())
    assert CONTRACT.from_fields(fields) == body


def test_fields_keep_optional_fields_absent() -> None:
    back = CONTRACT.from_fields(CONTRACT.to_fields(message()))
    assert not back.HasField("in_reply_to")
    assert not back.HasField("reference")


def test_to_fields_refuses_a_kind_without_label() -> None:
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.to_fields(message(kind=99))
    assert [(v.field, v.rule) for v in caught.value.violations] == [("kind", "enum.defined_only")]


def test_from_fields_ignores_envelope_fields() -> None:
    stored = {"kind": "note", "text": "x", **{name: "envelope" for name in RESERVED_FIELDS}}
    assert CONTRACT.from_fields(stored) == message(text="x")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"text": "x"}, {("kind", "fields")}),
        ({"kind": "REPLY", "text": "x"}, {("kind", "fields")}),
        ({"kind": "3", "text": "x"}, {("kind", "fields")}),
        ({"kind": "", "text": "x"}, {("kind", "fields")}),
        ({"kind": "note"}, {("text", "fields")}),
        ({"kind": "note", "text": "x", "colour": "red"}, {("colour", "fields")}),
        ({}, {("kind", "fields"), ("text", "fields")}),
    ],
)
def test_from_fields_refuses_corrupt_entries(fields: dict[str, str], expected: set[tuple[str, str]]) -> None:
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.from_fields(fields)
    assert {(v.field, v.rule) for v in caught.value.violations} == expected


def test_from_fields_refuses_non_string_values() -> None:
    corrupt: dict[str, Any] = {"kind": "note", "text": b"bytes"}
    with pytest.raises(ContractViolation) as caught:
        CONTRACT.from_fields(corrupt)
    assert ("text", "fields") in {(v.field, v.rule) for v in caught.value.violations}


# --- JSON (MCP) --------------------------------------------------------------------------------------


def test_to_json_of_a_minimal_message() -> None:
    assert CONTRACT.to_json(message(kind=Kind.KIND_STATUS, text="busy")) == {"kind": 4, "text": "busy"}


def test_to_json_of_a_full_message() -> None:
    body = message(kind=Kind.KIND_REPLY, text="ok", in_reply_to=ENVELOPE_ID, reference="r")
    assert CONTRACT.to_json(body) == {"kind": 3, "text": "ok", "in_reply_to": ENVELOPE_ID, "reference": "r"}


@pytest.mark.parametrize("kind", DEFINED_KINDS, ids=lambda k: Kind.Name(k))
def test_json_round_trip_every_kind(kind: Kind.ValueType) -> None:
    body = message(kind=kind, text="t\u20ac", in_reply_to=ENVELOPE_ID, reference="ref")
    data = json.loads(json.dumps(CONTRACT.to_json(body)))
    assert CONTRACT.from_json(data) == body


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (1, Kind.KIND_NOTE),
        (2, Kind.KIND_REQUEST),
        (3, Kind.KIND_REPLY),
        (4, Kind.KIND_STATUS),
        ("note", Kind.KIND_NOTE),
        ("request", Kind.KIND_REQUEST),
        ("reply", Kind.KIND_REPLY),
        ("status", Kind.KIND_STATUS),
    ],
)
def test_from_json_accepts_kind_numbers_and_names(kind: object, expected: Kind.ValueType) -> None:
    assert CONTRACT.from_json({"kind": kind, "text": "x"}).kind == expected


@pytest.mark.parametrize(
    "name", ["KIND_REQUEST", "kind_request", "Request", "NOTE", "unspecified", "KIND_UNSPECIFIED"]
)
def test_only_the_published_kind_names_are_accepted(name: str) -> None:
    with pytest.raises(ContractViolation) as info:
        CONTRACT.from_json({"kind": name, "text": "x"})
    (violation,) = info.value.violations
    assert (violation.field, violation.rule) == ("kind", "enum.name")
    assert "['note', 'request', 'reply', 'status']" in violation.message


@pytest.mark.parametrize("kind", [9, 0, -1, 3.5, True, None, [1]])
def test_a_bad_kind_of_any_type_lists_the_valid_kinds(kind: object) -> None:
    with pytest.raises(ContractViolation) as info:
        CONTRACT.validate(CONTRACT.from_json({"kind": kind, "text": "x"}))
    (violation,) = info.value.violations
    assert violation.field == "kind"
    assert "use 1-4 or one of ['note', 'request', 'reply', 'status']" in violation.message, violation.message


def test_in_reply_to_follows_the_envelope_id_rule() -> None:
    """agent.proto writes the envelope id pattern for in_reply_to; broker/ids.py makes the ids."""
    assert agent_message_module.IN_REPLY_TO_PATTERN == ENVELOPE_ID_PATTERN


def test_the_kind_names_are_the_proto_enum_names() -> None:
    """Accepted, published and stored names all come from agent.proto's Kind."""
    assert {number: name[len("KIND_") :].lower() for name, number in Kind.items() if number} == KIND_LABELS


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        (0, "required"),
        (99, "enum.defined_only"),
    ],
)
def test_from_json_leaves_kind_refinements_to_validate(kind: object, rule: str) -> None:
    body = CONTRACT.from_json({"kind": kind, "text": "x"})
    assert broken_rules(body) == {("kind", rule)}


def test_from_json_does_not_run_refinements() -> None:
    body = CONTRACT.from_json({"kind": 3, "text": "", "in_reply_to": "bad", "reference": ""})
    assert body.text == ""
    assert body.in_reply_to == "bad"
    assert body.HasField("reference")
    assert broken_rules(body) == {
        ("text", "required"),
        ("in_reply_to", "string.pattern"),
        ("reference", "string.min_len"),
    }


def test_from_json_missing_fields_take_defaults() -> None:
    assert CONTRACT.from_json({}) == AgentMessage()


def test_from_json_null_optionals_are_absent() -> None:
    body = CONTRACT.from_json({"kind": 1, "text": "x", "in_reply_to": None, "reference": None})
    assert not body.HasField("in_reply_to")
    assert not body.HasField("reference")


@pytest.mark.parametrize("data", [None, [], ["kind", 1], "text", 3, 1.5, True])
def test_from_json_refuses_non_objects(data: object) -> None:
    assert shape_errors(data) == {("", "type")}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"kind": 1, "text": "x", "sender": "me"}, {("sender", "unknown_field")}),
        ({"kind": 1, "text": "x", "from": "me"}, {("from", "unknown_field")}),
        ({"kind": 1, "text": "x", "Kind": 1}, {("Kind", "unknown_field")}),
        ({"kind": True, "text": "x"}, {("kind", "type")}),
        ({"kind": False, "text": "x"}, {("kind", "type")}),
        ({"kind": 1.0, "text": "x"}, {("kind", "type")}),
        ({"kind": None, "text": "x"}, {("kind", "type")}),
        ({"kind": [1], "text": "x"}, {("kind", "type")}),
        ({"kind": "bogus", "text": "x"}, {("kind", "enum.name")}),
        ({"kind": "3", "text": "x"}, {("kind", "enum.name")}),
        ({"kind": "", "text": "x"}, {("kind", "enum.name")}),
        ({"kind": 2**31, "text": "x"}, {("kind", "range")}),
        ({"kind": -(2**31) - 1, "text": "x"}, {("kind", "range")}),
        ({"kind": 1, "text": 5}, {("text", "type")}),
        ({"kind": 1, "text": None}, {("text", "type")}),
        ({"kind": 1, "text": ["x"]}, {("text", "type")}),
        ({"kind": 1, "text": "x", "in_reply_to": 5}, {("in_reply_to", "type")}),
        ({"kind": 1, "text": "x", "reference": {"url": "x"}}, {("reference", "type")}),
        ({"kind": 1, "text": "\ud800"}, {("text", "utf8")}),
        ({"kind": 1, "text": "x", "reference": "a\udfffb"}, {("reference", "utf8")}),
        ({1: "x", "kind": 1, "text": "x"}, {("1", "unknown_field")}),
    ],
)
def test_from_json_refuses_wrong_shapes(data: dict[Any, Any], expected: set[tuple[str, str]]) -> None:
    assert shape_errors(data) == expected


def test_from_json_lists_every_shape_problem() -> None:
    data = {"kind": True, "text": 5, "extra": 1, "in_reply_to": [], "reference": "ok"}
    assert shape_errors(data) == {
        ("kind", "type"),
        ("text", "type"),
        ("extra", "unknown_field"),
        ("in_reply_to", "type"),
    }


# --- properties --------------------------------------------------------------------------------------

envelope_ids = st.from_regex(ENVELOPE_ID_PATTERN, fullmatch=True)


@st.composite
def any_messages(draw: st.DrawFn) -> AgentMessage:
    """Any message the encodings must carry losslessly, valid or not (text may be empty)."""
    return message(
        kind=draw(st.sampled_from(DEFINED_KINDS)),
        text=draw(st.text()),
        in_reply_to=draw(st.none() | envelope_ids | st.text()),
        reference=draw(st.none() | st.text()),
    )


@st.composite
def valid_messages(draw: st.DrawFn) -> AgentMessage:
    kind = draw(st.sampled_from(DEFINED_KINDS))
    reply_to = draw(envelope_ids) if kind == Kind.KIND_REPLY else draw(st.none() | envelope_ids)
    return message(
        kind=kind,
        text=draw(st.text(min_size=1, max_size=200)),
        in_reply_to=reply_to,
        reference=draw(st.none() | st.text(min_size=1, max_size=2048)),
    )


@settings(deadline=None)
@given(any_messages())
def test_fields_round_trip_property(body: AgentMessage) -> None:
    fields = CONTRACT.to_fields(body)
    assert RESERVED_FIELDS.isdisjoint(fields)
    assert CONTRACT.from_fields(fields) == body


@settings(deadline=None)
@given(any_messages())
def test_json_round_trip_property(body: AgentMessage) -> None:
    data = json.loads(json.dumps(CONTRACT.to_json(body)))
    assert CONTRACT.from_json(data) == body


@settings(deadline=None)
@given(valid_messages())
def test_valid_messages_validate_and_survive_both_encodings(body: AgentMessage) -> None:
    CONTRACT.validate(body)
    from_fields = CONTRACT.from_fields(CONTRACT.to_fields(body))
    from_json = CONTRACT.from_json(json.loads(json.dumps(CONTRACT.to_json(body))))
    assert from_fields == body
    assert from_json == body
    CONTRACT.validate(from_fields)
    CONTRACT.validate(from_json)
