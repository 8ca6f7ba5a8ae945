"""``relay dead-letters list|requeue`` against the test Redis server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker.agent_message import AgentMessageContract
from relay.cli import main
from tests.messenger_support import ONCE, dead_letters_for, redis_messengers
from tests.support import unique_prefix


def inbox(url: str, prefix: str) -> list[str]:
    """The texts builder's inbox delivers (and acknowledges) now."""

    async def run() -> list[str]:
        async with redis_messengers(AgentMessageContract(), url, 1, ONCE, prefix=prefix) as (messenger,):
            texts = []
            async with messenger.receive("builder", wait=0.3) as deliveries:
                async for delivery in deliveries:
                    texts.append(delivery.envelope.message.text)
                    assert await delivery.ack()
            return texts

    return asyncio.run(run())


def test_list_shows_each_dead_letter_readably(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = unique_prefix()
    long_text = "line one\nline two \x1b[31m" + "x" * 200
    sent = dead_letters_for(redis_url, prefix, ["build the parser", long_text])
    assert main(["dead-letters", "list", "builder", "--redis-url", redis_url, "--prefix", prefix]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 dead letters for builder, oldest first:"
    assert out[1].startswith(f"{sent[0]}  from=alice  attempts=1  dead_at=20") and out[1].endswith(
        "kind=request"
    )
    assert out[2] == "    reason: ConnectionError: session queue unavailable"
    assert out[3] == "    text:   build the parser"
    assert out[6].startswith("    text:   line one\\nline two \\x1b[31mxxx") and out[6].endswith("x…")
    assert len(out) == 7 and "\x1b" not in out[6]


def test_list_as_json_and_with_a_limit(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = unique_prefix()
    sent = dead_letters_for(redis_url, prefix, ["a", "b", "c"])
    argv = ["dead-letters", "list", "builder", "--json", "--limit", "2", "--redis-url", redis_url]
    assert main([*argv, "--prefix", prefix]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agent"] == "builder" and data["total"] == 3
    assert [x["id"] for x in data["dead_letters"]] == sent[:2]
    first = data["dead_letters"][0]
    assert first["from"] == "alice" and first["tier"] == "in_process" and first["attempts"] == 1
    assert first["fields"] == {"kind": "request", "text": "a"}
    assert first["reason"].startswith("ConnectionError")


def test_requeue_some_then_all(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = unique_prefix()
    sent = dead_letters_for(redis_url, prefix, ["a", "b", "c"])
    base = ["--redis-url", redis_url, "--prefix", prefix]
    assert main(["dead-letters", "requeue", "builder", sent[1], *base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["not_found"] == []
    assert inbox(redis_url, prefix) == ["b"]

    assert main(["dead-letters", "requeue", "builder", sent[1], *base]) == 1
    assert f"not found (already requeued, or not builder's): {sent[1]}" in capsys.readouterr().out

    assert main(["dead-letters", "requeue", "builder", *base]) == 0
    out = capsys.readouterr().out
    assert out.startswith("requeued 2 dead letters of builder") and out.count("new id env_") == 2
    assert inbox(redis_url, prefix) == ["a", "c"]
    assert main(["dead-letters", "list", "builder", *base]) == 0
    assert capsys.readouterr().out == "no dead letters for builder\n"


def test_redis_url_comes_from_the_environment(
    redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = unique_prefix()
    dead_letters_for(redis_url, prefix, ["a"])
    monkeypatch.setenv("RELAY_REDIS_URL", redis_url)
    assert main(["dead-letters", "list", "builder", "--prefix", prefix]) == 0
    assert capsys.readouterr().out.startswith("1 dead letter for builder")


def test_usage_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RELAY_REDIS_URL", raising=False)
    monkeypatch.setenv("RELAY_DATA_DIR", str(tmp_path / "data"))
    assert main(["dead-letters", "list", "builder"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "relay: error: relay is not running here, so `relay dead-letters` has nothing to read"
    )
    assert f"no relay serve runs from the data dir {tmp_path}/data. " in err
    assert "--data-dir" in err and "--redis-url" in err and "RELAY_REDIS_URL" in err and err.count("\n") == 1
    assert main(["dead-letters", "list", "Not:Valid", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    assert capsys.readouterr().err.startswith("relay: error: AGENT: ")
    assert main(["dead-letters", "requeue", "builder", "nope", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    assert capsys.readouterr().err.startswith("relay: error: ID[0]: ")
    assert main(["dead-letters", "list", "builder", "--redis-url", "http://x"]) == 2
    assert "not a Redis URL" in capsys.readouterr().err


def test_an_unreachable_redis_is_a_runtime_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dead-letters", "list", "builder", "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("relay: error: cannot read Redis at redis://127.0.0.1:1/0") and err.count("\n") == 1


def test_list_of_an_unknown_agent_is_refused_like_inspect(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique_prefix()
    dead_letters_for(redis_url, prefix, ["a"])
    argv = ["--redis-url", redis_url, "--prefix", prefix]
    assert main(["dead-letters", "list", "nobody", *argv]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("relay: error: agent 'nobody' is not registered at redis://")
        and len(err.splitlines()) == 1
    )
    assert "`relay inspect` lists the registered agents" in err
    assert main(["dead-letters", "list", "builder", *argv]) == 0
