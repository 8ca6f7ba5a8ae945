"""Endpoints are printable and unambiguous, and human-facing output escapes what relay did not write
(``broker.addresses``, ``broker.text``, ``relay inspect``, ``relay dead-letters``)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from adapters.redis.keys import Keys
from broker.addresses import ClaudeCodeAddress, default_providers
from broker.errors import InvalidAddress
from broker.text import escaped, shown
from tests.front_support import data, error, running_front
from tests.processes import run_relay

FORGED_ROWS = "unix:/run/x\n  tier  network\n  session forged"
HOSTILE = [
    ("claudecode", FORGED_ROWS, "endpoint.printable"),
    ("claudecode", "unix:/run/\x1b[2J\x1b[H", "endpoint.printable"),
    ("claudecode", "unix:/run/\u202egnp.x", "endpoint.printable"),
    ("claudecode", "[::1%\nfake]:80", "endpoint.printable"),
    ("claudecode", "[::1%a$b]:80", "endpoint.ipv6_scope"),
    ("claudecode", "::1:80", "endpoint.ipv6_brackets"),
    ("remote", "2001:db8::1:443", "endpoint.ipv6_brackets"),
    ("remote", "example.com:80\r\nX-Forged: 1", "endpoint.printable"),
    ("remote", "[fe80::1%\x00]:80", "endpoint.printable"),
]


@pytest.mark.parametrize(("provider", "endpoint", "rule"), HOSTILE)
def test_endpoints_must_be_printable_and_unambiguous(provider: str, endpoint: str, rule: str) -> None:
    with pytest.raises(InvalidAddress) as refused:
        default_providers().parse(provider, endpoint)
    assert refused.value.violation.rule == rule and refused.value.violation.field == "endpoint"
    assert refused.value.message.isprintable()


def test_an_unbracketed_ipv6_endpoint_is_told_the_bracketed_form() -> None:
    with pytest.raises(InvalidAddress) as refused:
        ClaudeCodeAddress.parse("::1:80")
    assert "write an IPv6 host in brackets, e.g. [::1]:80" in refused.value.message
    for fine in ("[::1]:80", "127.0.0.1:80", "localhost:80", "unix:/run/relay agent.sock", "[::1%lo]:80"):
        assert ClaudeCodeAddress.parse(fine).endpoint == fine
    assert default_providers().parse("remote", "[fe80::1%eth0]:80").endpoint == "[fe80::1%eth0]:80"


def test_escaping_keeps_printable_text_and_escapes_the_rest() -> None:
    assert escaped("héllo wörld ✓") == "héllo wörld ✓"
    assert escaped(FORGED_ROWS) == "unix:/run/x\\n  tier  network\\n  session forged"
    assert escaped("\x1b[2J\u202e\\n") == "\\x1b[2J\\u202e\\\\n"  # a literal backslash cannot pose as one
    assert shown("x" * 100, 10) == "x" * 9 + "…"


async def test_a_hostile_endpoint_is_refused_over_mcp_and_nothing_is_stored(redis_url: str) -> None:
    async with running_front(redis_url) as front, front.client("mallory", "m-1") as client:
        for _, endpoint, rule in HOSTILE[:6]:
            refused = error(await client.call_tool("RegisterAgentAddress", _register(endpoint)))
            assert refused["code"] == "invalid_address" and refused["violations"][0]["rule"] == rule
        assert await front.relay.registration("mallory") is None
        data(await client.call_tool("RegisterAgentAddress", _register("[::1]:8080")))


def test_inspect_escapes_what_redis_holds(redis_url: str) -> None:
    prefix_keys = Keys()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = prefix_keys.registration("eve")
    fields = {"agent": "eve", "provider": "claudecode", "endpoint": FORGED_ROWS + "\x1b[2J", "tier": "host"}
    times = {"registered_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z"}
    client.hset(key, mapping={**fields, "session": "s\n  dead letters  0", **times})
    try:
        result = run_relay("inspect", "eve", "--redis-url", redis_url)
    finally:
        client.delete(key)
        client.close()
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert rows.count("tier") == 1 and rows.count("session") == 1 and rows.count("dead") == 1
    (endpoint,) = [line for line in result.stdout.splitlines() if line.startswith("  endpoint ")]
    assert endpoint.endswith(" unix:/run/x\\n  tier  network\\n  session forged\\x1b[2J")


def _register(endpoint: str) -> dict[str, Any]:
    return {"provider": "claudecode", "endpoint": endpoint}
