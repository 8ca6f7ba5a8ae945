"""Hostile bodies at ``POST /agent/wait`` (``test_fuzz.py`` style): every answer is a 200 notice or a
clean, precise refusal; a refused wait moves no cursor; no traceback is logged; no key outside the
documented layout appears."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.front.paths import WAIT_PATH
from broker.front.wait import MAX_TIMEOUT_MS
from tests.fuzz_support import JSON, ErrorLog, assert_layout, error_log
from tests.rpc_support import ThreadedFront, call, clean, encode, register, tool_outcome

__all__ = ["error_log"]

TIMEOUTS = st.one_of(
    st.integers(0, MAX_TIMEOUT_MS),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, MAX_TIMEOUT_MS, MAX_TIMEOUT_MS + 1]),
    JSON,
)


@st.composite
def wait_bodies(draw: st.DrawFn) -> bytes:
    shape = draw(st.sampled_from(["near"] * 6 + ["json", "raw", "text"]))
    if shape == "near":
        body: dict[str, Any] = {"timeout_ms": draw(TIMEOUTS)}
        if draw(st.integers(0, 5)) == 0:
            body[draw(st.text(max_size=20))] = draw(JSON)
        if draw(st.integers(0, 9)) == 0:
            del body["timeout_ms"]
        return encode(body)
    if shape == "json":
        return encode(draw(JSON))
    if shape == "text":
        return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass")
    return draw(st.binary(max_size=1500))


@pytest.mark.slow
def test_generated_wait_bodies_get_notices_or_precise_refusals(
    threaded: ThreadedFront, store: redis.Redis, error_log: ErrorLog
) -> None:
    http = httpx2.Client(timeout=30)
    sender = register(http, threaded, "fuzz-ws", "s1")
    waiter = register(http, threaded, "fuzz-ww", "w1")
    url = threaded.base + WAIT_PATH
    statuses: dict[int, int] = {}

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(wait_bodies())
    def check(body: bytes) -> None:
        # one new envelope first: a valid wait then answers at once, with exactly that one
        message = {"to": "fuzz-ww", "message": {"kind": 1, "text": "ping"}}
        outcome, sent = tool_outcome(
            clean(http.post(threaded.url, content=encode(call("SendAgentMessage", message)), headers=sender))
        )
        assert outcome == "ok", sent
        response = http.post(url, content=body, headers=waiter)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert "Traceback" not in response.text
        answer = json.loads(response.text)
        if response.status_code == 200:
            assert answer["count"] == 1 and [e["id"] for e in answer["envelopes"]] == [sent["id"]]
            return
        assert response.status_code in (400, 413), response.text
        error = answer["error"]
        assert error["code"] == "invalid_argument" and error["retryable"] is False
        (violation,) = error["violations"]
        assert isinstance(violation["field"], str) and violation["rule"] and violation["message"]
        after = http.post(url, content=b'{"timeout_ms": 0}', headers=waiter).json()
        assert [e["id"] for e in after["envelopes"]] == [sent["id"]]  # nothing was moved

    try:
        check()
    finally:
        http.close()
    print(f"\nwait fuzz: HTTP statuses {dict(sorted(statuses.items()))}")
    assert statuses.get(200, 0) > 10 and statuses.get(400, 0) > 50
    assert not error_log.problems(), error_log.problems()
    assert_layout(store, threaded.prefix, {"fuzz-ws", "fuzz-ww"})
