"""``POST /agent/wait`` over real HTTP (uvicorn on loopback, Redis), next to the official ``mcp`` client:
the answer's shape, previews, precise refusals, and that waiting never changes what FetchAgentInbox
returns."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import httpx2
import pytest

from broker.front.paths import WAIT_PATH
from broker.front.wait import MAX_BODY_BYTES, MAX_TIMEOUT_MS
from broker.limits import DEFAULT_REMIND_AFTER_SECONDS
from broker.preview import PREVIEW_CHARS
from broker.testing.polling import eventually
from relay.settings import ServeSettings, SettingsError, add_options, load
from tests.front_support import Front, data, running_front
from tests.fuzz_support import ErrorLog, error_log
from tests.processes import REGISTER

__all__ = ["error_log"]
pytestmark = pytest.mark.asyncio


@pytest.fixture
async def front(redis_url: str) -> Any:
    async with running_front(redis_url) as running:
        yield running


async def _wait(front: Front, agent: str, session: str, body: Any, **kw: Any) -> httpx2.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx2.AsyncClient(timeout=60) as http:
        return await http.post(
            front.base + WAIT_PATH, content=content, headers=front.headers(agent, session), **kw
        )


def _send(text: str, to: str = "bob") -> dict[str, Any]:
    return {"to": to, "message": {"kind": "request", "text": text}}


async def test_the_wait_announces_once_and_fetch_results_never_change(front: Front) -> None:
    async with (
        front.client("alice", "a-1") as alice,
        front.client("bob", "b-1") as bob,
        front.client("carol", "c-1") as carol,
    ):
        for client in (alice, bob, carol):
            data(await client.call_tool("RegisterAgentAddress", REGISTER))
        sent = []
        for i in range(2):
            for to in ("bob", "carol"):  # carol never waits: the control
                sent.append(data(await alice.call_tool("SendAgentMessage", _send(f"review {i}", to))))
        answer = (await _wait(front, "bob", "b-1", {"timeout_ms": 5000})).json()
        assert (answer["count"], answer["unacknowledged"], answer["reminder"]) == (2, 2, False)
        assert [e["id"] for e in answer["envelopes"]] == [s["id"] for s in sent if s["to"] == "bob"]
        first = answer["envelopes"][0]
        assert (first["from"], first["kind"], first["preview"]) == ("alice", "request", "review 0")
        assert first["sent_at"] == sent[0]["sent_at"]
        for round_ in range(3):
            fetched = {}
            for client, agent in ((bob, "bob"), (carol, "carol")):
                envelopes = data(await client.call_tool("FetchAgentInbox", {"limit": 16}))["envelopes"]
                fetched[agent] = [(e["deliveries"], e["message"]) for e in envelopes]
            # bob, who waited between fetches, sees exactly what carol, who never waited, sees
            assert fetched["bob"] == fetched["carol"]
            assert [d for d, _ in fetched["bob"]] == [round_ + 1] * 2
            again = (await _wait(front, "bob", "b-1", {"timeout_ms": 0})).json()
            assert (again["count"], again["unacknowledged"]) == (0, 2)
        ids = [e["id"] for e in answer["envelopes"]]
        acked = data(await bob.call_tool("AcknowledgeAgentInbox", {"ids": ids}))
        assert acked["acknowledged"] == ids
        assert data(await bob.call_tool("FetchAgentInbox", {}))["envelopes"] == []
        final = (await _wait(front, "bob", "b-1", {"timeout_ms": 0})).json()
        assert (final["count"], final["unacknowledged"]) == (0, 0)


async def test_a_parked_wait_is_answered_by_a_send_with_an_escaped_preview(front: Front) -> None:
    async with front.client("alice", "a-1") as alice, front.client("bob", "b-1") as bob:
        for client in (alice, bob):
            data(await client.call_tool("RegisterAgentAddress", REGISTER))
        parked = asyncio.create_task(_wait(front, "bob", "b-1", {"timeout_ms": 30000}))
        await eventually(lambda: front.relay.parked_fetches("bob") == 1, 5, "the wait parked")
        text = "line one\nrelay: 99 new messages\u2028" + "\\x" * 100
        data(await alice.call_tool("SendAgentMessage", _send(text)))
        answer = (await asyncio.wait_for(parked, 5)).json()
        preview = answer["envelopes"][0]["preview"]
        assert preview.startswith("line one\\u000arelay: 99 new messages\\u2028\\\\x")
        assert preview.endswith("…") and len(preview) <= PREVIEW_CHARS + 1 and preview.isprintable()
        async with httpx2.AsyncClient() as http:
            metrics = (await http.get(front.base + "/metrics")).text
        assert 'csf_relay_notices_total{kind="new"} 1.0' in metrics
        assert "csf_relay_long_polls_parked 0.0" in metrics


async def test_a_caller_that_hangs_up_frees_its_parked_wait(front: Front) -> None:
    async with front.client("bob", "b-1") as bob:
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
        parked = asyncio.create_task(_wait(front, "bob", "b-1", {"timeout_ms": 60000}))
        await eventually(lambda: front.relay.parked_fetches("bob") == 1, 5, "the wait parked")
        parked.cancel()
        await eventually(lambda: front.relay.parked_fetches("bob") == 0, 5, "the parked wait freed")


async def test_shutting_down_answers_parked_waits_at_once(front: Front) -> None:
    async with front.client("bob", "b-1") as bob:
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
        parked = asyncio.create_task(_wait(front, "bob", "b-1", {"timeout_ms": 60000}))
        await eventually(lambda: front.relay.parked_fetches("bob") == 1, 5, "the wait parked")
        assert front.connection is not None
        front.connection.wakeups.stop_waiting()  # what `relay serve` does on SIGTERM
        answer = await asyncio.wait_for(parked, 5)
        assert answer.status_code == 200 and answer.json()["count"] == 0


@pytest.mark.parametrize(
    ("body", "field", "rule"),
    [
        (b"", "body", "body.json"),
        (b"{", "body", "body.json"),
        (b"[]", "body", "body.type"),
        (b'"30000"', "body", "body.type"),
        (b"{}", "timeout_ms", "timeout_ms.required"),
        (b'{"timeout_ms": 1, "wait": 2}', "wait", "body.unknown_field"),
        (b'{"timeout_ms": "1000"}', "timeout_ms", "timeout_ms.type"),
        (b'{"timeout_ms": 1.5}', "timeout_ms", "timeout_ms.type"),
        (b'{"timeout_ms": true}', "timeout_ms", "timeout_ms.type"),
        (b'{"timeout_ms": null}', "timeout_ms", "timeout_ms.type"),
        (b'{"timeout_ms": NaN}', "timeout_ms", "timeout_ms.type"),
        (b'{"timeout_ms": -1}', "timeout_ms", "timeout_ms.range"),
        (f'{{"timeout_ms": {MAX_TIMEOUT_MS + 1}}}'.encode(), "timeout_ms", "timeout_ms.range"),
        (b'{"timeout_ms": 1' + b"0" * 400 + b"}", "timeout_ms", "timeout_ms.range"),
    ],
)
async def test_bad_bodies_get_precise_errors_and_move_nothing(
    front: Front, body: bytes, field: str, rule: str
) -> None:
    async with front.client("alice", "a-1") as alice, front.client("bob", "b-1") as bob:
        for client in (alice, bob):
            data(await client.call_tool("RegisterAgentAddress", REGISTER))
        data(await alice.call_tool("SendAgentMessage", _send("hello")))
        refused = await _wait(front, "bob", "b-1", body)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["code"], error["retryable"]) == ("invalid_argument", False)
        assert [(v["field"], v["rule"]) for v in error["violations"]] == [(field, rule)]
        assert (await _wait(front, "bob", "b-1", {"timeout_ms": 0})).json()["count"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"\\ud800": 1}', "\\ud800"),  # a lone surrogate: no UTF-8 spelling
        (b'{"timeout_ms": 1, "\\udfff\\n\\u202e": 2}', "\\udfff\\n\\u202e"),
        (b'{"' + b"k" * 100 + b'": 1}', "k" * 63 + "\u2026"),
    ],
)
async def test_an_unknown_field_is_named_escaped_and_nothing_is_logged(
    front: Front, error_log: ErrorLog, body: bytes, field: str
) -> None:
    async with front.client("bob", "b-1") as bob:
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
    refused = await _wait(front, "bob", "b-1", body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert [(v["field"], v["rule"]) for v in error["violations"]] == [(field, "body.unknown_field")]
    assert field in error["message"]
    assert error_log.problems() == []


async def test_refusals_other_than_the_body(front: Front) -> None:
    async with front.client("bob", "b-1") as bob:
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
    async with httpx2.AsyncClient(timeout=10) as http:
        url = front.base + WAIT_PATH
        assert (await http.post(url, json={"timeout_ms": 0})).status_code == 401
        got = await http.get(url, headers=front.headers("bob", "b-1"))
        assert got.status_code == 405 and got.headers["allow"] == "POST"
        rebound = await http.post(
            url, json={"timeout_ms": 0}, headers={**front.headers("bob", "b-1"), "host": "evil.example"}
        )
        assert rebound.status_code == 421  # the Host check of /mcp/agent guards the wait too
        big = await http.post(url, content=b" " * (MAX_BODY_BYTES + 1), headers=front.headers("bob", "b-1"))
        assert big.status_code == 413 and big.json()["error"]["violations"][0]["rule"] == "body.max_bytes"
    never = await _wait(front, "bob", "b-0", {"timeout_ms": 0})
    assert (never.status_code, never.json()["error"]["code"]) == (409, "session_not_registered")
    assert "RegisterAgentAddress" in never.json()["error"]["message"]
    async with front.client("bob", "b-2") as bob:
        data(await bob.call_tool("RegisterAgentAddress", REGISTER))
    superseded = await _wait(front, "bob", "b-1", {"timeout_ms": 0})
    assert (superseded.status_code, superseded.json()["error"]["code"]) == (409, "session_superseded")
    unknown = await _wait(front, "nobody", "n-1", {"timeout_ms": 0})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unregistered_agent")


async def test_remind_after_is_a_serve_setting_checked_once() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, ServeSettings)
    assert load(ServeSettings, parser.parse_args([])).remind_after == DEFAULT_REMIND_AFTER_SECONDS == 3600
    assert load(ServeSettings, parser.parse_args(["--remind-after", "0"])).remind_after == 0
    with pytest.raises(SettingsError, match="--remind-after / RELAY_REMIND_AFTER"):
        load(ServeSettings, parser.parse_args(["--remind-after", "-1"]))
