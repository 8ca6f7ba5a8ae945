"""``relay show ENVELOPE_ID``: from an id in a log line to the stream entry, on one Redis and on a
Redis Cluster, for each state an envelope can be found in."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from adapters.redis.keys import Keys
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessageContract
from relay.cli import main
from tests.messenger_support import dead_letters_for
from tests.support import redis_relays, unique_prefix

BACKENDS = ["redis_url", "cluster_url"]


async def envelopes(url: str, prefix: str) -> tuple[str, str, str]:
    """Three envelopes alice -> bob: one queued, one delivered twice, one acknowledged."""
    contract = AgentMessageContract()
    async with redis_relays(contract, url, 1, prefix=prefix) as (relay,):
        for agent in ("alice", "bob"):
            await relay.register(agent, ClaudeCodeAddress.parse("127.0.0.1:14111"), f"{agent}-1")
        acked = await relay.send("alice", "bob", contract.from_json({"kind": 1, "text": "acked"}))
        delivered = await relay.send("alice", "bob", contract.from_json({"kind": 2, "text": "secret"}))
        await relay.fetch("bob", 2)
        await relay.ack("bob", [acked.id])
        await relay.fetch("bob", 1)
        queued = await relay.send("alice", "bob", contract.from_json({"kind": 1, "text": "later"}))
    return queued.id, delivered.id, acked.id


def show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_show_finds_queued_and_delivered_envelopes(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    url, prefix = request.getfixturevalue(backend), unique_prefix()
    queued, delivered, acked = asyncio.run(envelopes(url, prefix))
    where = ["--redis-url", url, "--prefix", prefix]
    code, out, _ = show(capsys, delivered, *where, "--json")
    found = json.loads(out)
    assert code == 0 and found["state"] == "delivered" and found["deliveries"] == 2
    assert (found["from"], found["to"], found["tier"]) == ("alice", "bob", "host")
    inbox = Keys(prefix).inbox("bob")
    assert found["stream_key"] == inbox and found["stream_entry"] == found["entry_id"]
    client = redis.RedisCluster.from_url(url) if backend == "cluster_url" else redis.Redis.from_url(url)
    with client:  # the entry the id names is the one Redis holds
        ((_, fields),) = client.xrange(inbox, found["stream_entry"], found["stream_entry"])
        assert fields[b"from"] == b"alice" and delivered.endswith(fields[b"nonce"].decode())
    code, out, _ = show(capsys, queued, *where)
    lines = out.splitlines()
    assert code == 0 and lines[0] == queued and "secret" not in out
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines[1:] if line.startswith("  ")}
    assert rows["state"] == "queued (in the inbox, not yet fetched)" and rows["deliveries"] == "0"
    assert rows["stream"].startswith(f"{inbox} entry ") and rows["redis-cli"].startswith(
        "redis-cli -c XRANGE"
    )
    code, _, err = show(capsys, acked, *where, "--agent", "bob")
    assert code == 1 and "is not in bob's inbox or dead letters" in err and "acknowledged" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_show_finds_dead_letters(
    backend: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    url, prefix = request.getfixturevalue(backend), unique_prefix()
    (dead,) = dead_letters_for(url, prefix, ["build the parser"])
    code, out, _ = show(capsys, dead, "--redis-url", url, "--prefix", prefix, "--json")
    found = json.loads(out)
    assert code == 0 and found["state"] == "dead_lettered" and found["to"] == "builder"
    assert found["stream_key"] == Keys(prefix).dead_letters("builder") and found["deliveries"] == 1
    assert found["reason"].startswith("ConnectionError")


def test_show_refuses_what_is_not_an_envelope_id(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = show(capsys, "env_\x1b[2Jnope", "--redis-url", redis_url)
    assert code == 2 and "\x1b" not in err and "ENVELOPE_ID" in err and len(err.splitlines()) == 1
