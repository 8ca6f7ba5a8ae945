"""What the hostile-input tests share (``test_fuzz.py``, ``test_wait_fuzz.py``): a log handler that
catches errors and tracebacks, the check that Redis holds only documented keys, and a strategy for
arbitrary JSON built from hostile text."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
import redis
from hypothesis import strategies as st

from broker.credentials import ID_PATTERN
from broker.ids import AGENT_ID_PATTERN, IDEMPOTENCY_KEY_PATTERN
from tests.rpc_support import HOSTILE_IDS


class ErrorLog(logging.Handler):
    """Collects every record at ERROR or above, and every record that carries a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)

    def problems(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records]


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def assert_layout(store: redis.Redis, prefix: str, agents: set[str]) -> None:
    """Every key under ``prefix`` is one of the documented ones, for an agent the test authenticated."""
    agent = AGENT_ID_PATTERN.removeprefix("^").removesuffix("$")
    idem = IDEMPOTENCY_KEY_PATTERN.removeprefix("^").removesuffix("$")
    tagged = rf"(?:agent|inbox|dead|rate|notice|outcome|counts|credentials):\{{({agent})\}}"
    sending = rf"sent:\{{({agent})\}}:\d+|claim:\{{({agent})\}}:{idem}|idem:\{{({agent})\}}:{agent}:{idem}"
    pattern = re.compile(
        rf"{re.escape(prefix)}:(?:{tagged}|{sending}|agents|directory|directory-built|credential:{ID_PATTERN}|credential-agents|credential-events)"
    )
    keys = list(store.scan_iter(f"{prefix}:*", count=1000))
    assert keys, "the run created no keys at all"
    for key in keys:
        match = pattern.fullmatch(key)
        assert match is not None, f"undocumented key {key!r}"
        named = next((group for group in match.groups() if group is not None), None)
        if named is not None:
            assert named in agents, f"key {key!r} names an agent nobody authenticated as"
    assert set(store.smembers(f"{prefix}:agents")) <= agents
    assert set(store.zrange(f"{prefix}:directory", 0, -1)) <= agents


HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(HOSTILE_IDS),
    st.from_regex(AGENT_ID_PATTERN, fullmatch=True),
    st.from_regex(r"env_[0-9A-Z*{}: \n]{20,30}", fullmatch=True),
    st.sampled_from(["bob", "fuzz-r", "note", "request", "reply", "status", "KIND_NOTE"]),
)
JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        HOSTILE_TEXT,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(HOSTILE_TEXT, st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=20,
)
