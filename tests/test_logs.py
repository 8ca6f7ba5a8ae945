"""``relay serve --log-format json``: one JSON object per line; send, deliver and acknowledge events carry
the envelope id, from, to, tier and outcome, and message text never appears at info level."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import KeyRing, agent_headers
from relay.logs import JsonFormatter
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, call_tool, ok

EVENT = ("envelope", "from", "to", "tier", "outcome")


@pytest.fixture(scope="module")
async def session_log(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[list[dict[str, Any]], str, str]]:
    """Run one worker with JSON logs through register, send, fetch, acknowledge and a refused send;
    yields (parsed log lines, the secret text that was sent, the envelope id)."""
    tmp = tmp_path_factory.mktemp("logs")
    server = EmbeddedRedis()
    server.start()
    try:
        key = key_file(tmp)
        worker = ServeProcess(
            ["--redis-url", server.url, "--agent-mcp-key-file", str(key), "--log-format", "json"],
            tmp / "serve.log",
        ).start()
        secret = f"do not log me {uuid.uuid4().hex}"
        try:
            envelope = await _conversation(worker, load_key_file(key), secret)
        finally:
            assert worker.stop() == 0
        text = worker.log.read_text()
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        yield lines, secret, envelope
    finally:
        server.stop()


async def _conversation(worker: ServeProcess, keyring: KeyRing, text: str) -> str:
    alice, bob = agent_headers(keyring, "alice", "alice-1"), agent_headers(keyring, "bob", "bob-1")
    async with httpx2.AsyncClient(timeout=30) as http:
        await ok(http, worker.url, alice, "RegisterAgentAddress", REGISTER)
        await ok(http, worker.url, bob, "RegisterAgentAddress", REGISTER)
        message = {"kind": 2, "text": text}
        sent = await ok(http, worker.url, alice, "SendAgentMessage", {"to": "bob", "message": message})
        got = (await ok(http, worker.url, bob, "FetchAgentInbox", {}))["envelopes"]
        assert [e["message"]["text"] for e in got] == [text]
        await ok(http, worker.url, bob, "FetchAgentInbox", {})  # a re-fetch is not a delivery
        await ok(http, worker.url, bob, "AcknowledgeAgentInbox", {"ids": [sent["id"]]})
        refused = await call_tool(
            http, worker.url, alice, "SendAgentMessage", {"to": "nobody", "message": message}
        )
        assert refused["isError"]
        return str(sent["id"])


def _events(lines: list[dict[str, Any]], msg: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("msg") == msg and line.get("logger") == "relay.front"]


def test_every_line_is_a_json_object_with_the_standard_keys(
    session_log: tuple[list[dict[str, Any]], str, str],
) -> None:
    lines, _, _ = session_log
    assert lines, "relay serve logged nothing"
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= line.keys(), line
    assert any("relay serving on" in line["msg"] for line in lines)


def test_send_deliver_and_refusal_carry_the_envelope_fields(
    session_log: tuple[list[dict[str, Any]], str, str],
) -> None:
    lines, _, envelope = session_log
    expected = {"envelope": envelope, "from": "alice", "to": "bob", "tier": "host", "outcome": "ok"}
    for msg in ("sent", "delivered"):
        (event,) = _events(lines, msg)
        assert {k: event.get(k) for k in EVENT} == expected, event
        assert event["level"] == "info"
    (refused,) = _events(lines, "send refused")
    assert (refused["from"], refused["to"], refused["outcome"]) == ("alice", "nobody", "unknown_recipient")


def test_acknowledge_carries_envelope_recipient_and_outcome(
    session_log: tuple[list[dict[str, Any]], str, str],
) -> None:
    lines, _, envelope = session_log
    (event,) = _events(lines, "acknowledged")
    assert (event.get("envelope"), event.get("to"), event.get("outcome")) == (envelope, "bob", "ok")


def test_acknowledge_carries_sender_and_tier(session_log: tuple[list[dict[str, Any]], str, str]) -> None:
    lines, _, _ = session_log
    (event,) = _events(lines, "acknowledged")
    assert (event.get("from"), event.get("tier")) == ("alice", "host")


def test_message_text_is_never_logged(session_log: tuple[list[dict[str, Any]], str, str]) -> None:
    lines, secret, _ = session_log
    assert all(secret not in json.dumps(line) for line in lines)


def test_json_formatter_keeps_extra_fields_and_exceptions() -> None:
    record = logging.makeLogRecord(
        {
            "name": "relay.front",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "sent",
            "envelope": "env_1",
        }
    )
    data = json.loads(JsonFormatter().format(record))
    assert data["msg"] == "sent" and data["envelope"] == "env_1" and data["level"] == "info"
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exc"]


def test_text_log_fields_cannot_forge_lines() -> None:
    import logging

    from relay.logs import TextFormatter

    record = logging.makeLogRecord(
        {"msg": "send refused", "to": "x\n2026 INFO sent from=alice", "outcome": "ok"}
    )
    line = TextFormatter().format(record)
    assert "\n" not in line and 'to="x\\n2026 INFO sent from=alice"' in line and "outcome=ok" in line
