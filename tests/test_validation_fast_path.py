"""The contract's validation fast path agrees with protovalidate on every message, valid or not.

``AgentMessageContract.validate`` accepts the messages its fast path recognises as valid without asking
protovalidate (which costs a tenth of a send's CPU) and hands every other message to protovalidate. That
is only sound if the fast path never accepts a message protovalidate refuses: these properties generate
messages around every rule's edge and compare the two.
"""

from __future__ import annotations

import protovalidate
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from broker import agent_message
from broker.agent_message import (
    MAX_REFERENCE_CHARS,
    MAX_TEXT_BYTES,
    AgentMessage,
    AgentMessageContract,
    Kind,
)
from broker.errors import ContractViolation
from broker.ids import ENVELOPE_ID_PATTERN

CHECKS = settings(
    max_examples=600, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
VALIDATOR = protovalidate.Validator()

KINDS = st.one_of(st.sampled_from([number for _, number in Kind.items()]), st.integers(-3, 9))
UNICODE = st.characters(exclude_categories=["Cs"])
TEXTS = st.one_of(
    st.text(UNICODE, max_size=20),
    st.sampled_from(["", " ", "\n", "\x00"]),
    # around the byte bound: ASCII (1 byte), é (2), € (3), 😀 (4) just under, at and over it
    st.sampled_from(["a", "é", "€", "😀"]).flatmap(
        lambda c: st.integers(-2, 2).map(lambda d: c * (MAX_TEXT_BYTES // len(c.encode()) + d))
    ),
)
ENVELOPE_IDS = st.from_regex(ENVELOPE_ID_PATTERN, fullmatch=True)
IN_REPLY_TO = st.one_of(
    st.none(),
    ENVELOPE_IDS,
    ENVELOPE_IDS.map(lambda i: i + "\n"),
    ENVELOPE_IDS.map(lambda i: "\n" + i),
    ENVELOPE_IDS.map(lambda i: i.lower()),
    ENVELOPE_IDS.map(lambda i: i[:-1]),
    ENVELOPE_IDS.map(lambda i: i + "0"),
    ENVELOPE_IDS.map(lambda i: i[:10] + "I" + i[11:]),
    st.text(UNICODE, max_size=40),
)
REFERENCES = st.one_of(
    st.none(),
    st.text(UNICODE, max_size=10),
    st.integers(-1, 1).map(lambda d: "r" * (MAX_REFERENCE_CHARS + d)),
    st.integers(-1, 1).map(lambda d: "😀" * (MAX_REFERENCE_CHARS + d)),
)


@st.composite
def messages(draw: st.DrawFn) -> AgentMessage:
    message = AgentMessage(kind=Kind.ValueType(draw(KINDS)), text=draw(TEXTS))
    in_reply_to = draw(IN_REPLY_TO)
    if in_reply_to is not None:
        message.in_reply_to = in_reply_to
    reference = draw(REFERENCES)
    if reference is not None:
        message.reference = reference
    return message


def field_path(violation: protovalidate.Violation) -> str:
    path = violation.proto.field
    return "" if path is None else ".".join(e.field_name for e in path.elements)


def protovalidate_accepts(message: AgentMessage) -> bool:
    try:
        VALIDATOR.validate(message)
    except protovalidate.ValidationError:
        return False
    return True


def test_the_fast_path_is_on_for_the_proto_it_was_written_for() -> None:
    assert agent_message._RULES_PINNED


@CHECKS
@given(messages())
def test_the_fast_path_accepts_exactly_what_protovalidate_accepts(message: AgentMessage) -> None:
    expected = protovalidate_accepts(message)
    event("valid" if expected else "invalid")
    assert agent_message._passes_pinned_rules(message) == expected


@CHECKS
@given(messages())
def test_validate_refuses_with_protovalidate_s_violations(message: AgentMessage) -> None:
    try:
        AgentMessageContract().validate(message)
    except ContractViolation as exc:
        assert not protovalidate_accepts(message)
        found = {(v.field, v.rule) for v in exc.violations}
        assert found == {(field_path(v), v.proto.rule_id) for v in VALIDATOR.collect_violations(message)}
    else:
        assert protovalidate_accepts(message)
