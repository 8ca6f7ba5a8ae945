"""``relay migrate`` on a store written in relay's earlier layout (a global ``<prefix>:agents`` set
beside each agent's keys): the upgraded relay finds every registration and queued envelope, and a
second run changes nothing."""

from __future__ import annotations

from pathlib import Path

import redis

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.keys import GROUP, Keys
from broker.agent_message import AgentMessageContract
from broker.relay import Relay
from tests.processes import run_relay
from tests.support import old_registration, unique_prefix

# one envelope as the earlier send script wrote it (same fields as today)
OLD_ENTRY = {
    "from": "alice",
    "tier": "host",
    "sent_at": "2026-11-29T13:37:32.906Z",
    "kind": "request",
    "text": "review PR 12",
    "nonce": "7K2M9QX4ZP",
}


def fill_old_layout(client: redis.Redis, keys: Keys) -> None:
    """What the earlier register and send scripts left in Redis: three registrations in the global
    index, bob with one queued envelope, carol registered but with her inbox stream removed by hand,
    and a stale index member without a registration."""
    for agent in ("alice", "bob", "carol"):
        client.hset(keys.registration(agent), mapping=old_registration(agent))
        client.sadd(keys.legacy_agents(), agent)
        if agent != "carol":
            client.xgroup_create(keys.inbox(agent), GROUP, id="0", mkstream=True)
    client.sadd(keys.legacy_agents(), "ghost")
    client.xadd(keys.inbox("bob"), OLD_ENTRY)  # type: ignore[arg-type]


async def test_migrate_is_idempotent_and_the_upgraded_relay_finds_its_data(redis_url: str) -> None:
    keys = Keys(unique_prefix())
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    fill_old_layout(sync, keys)

    dry = run_relay("migrate", "--redis-url", redis_url, "--prefix", keys.prefix, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete the old agent index (4 ids); would create 1 missing inbox group" in dry.stdout
    assert sync.exists(keys.legacy_agents())

    first = run_relay("migrate", "--redis-url", redis_url, "--prefix", keys.prefix)
    assert first.returncode == 0, first.stderr
    assert "deleted the old agent index (4 ids); created 1 missing inbox group; 3 registered" in first.stdout
    assert not sync.exists(keys.legacy_agents())
    assert sync.xinfo_groups(keys.inbox("carol"))[0]["name"] == GROUP

    again = run_relay("migrate", "--redis-url", redis_url, "--prefix", keys.prefix)
    assert again.returncode == 0 and again.stdout.startswith("nothing to migrate"), again

    connection = RedisConnection(RedisSettings(url=redis_url, prefix=keys.prefix))
    async with Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection)) as relay:
        assert [r.agent for r in await relay.registrations()] == ["alice", "bob", "carol"]
        (old,) = await relay.fetch("bob", 16, session="bob-1")
        assert old.sender == "alice" and old.message.text == "review PR 12" and old.deliveries == 1
        new = await relay.send("alice", "carol", AgentMessageContract().from_json({"kind": 1, "text": "hi"}))
        assert [e.id for e in await relay.fetch("carol", 16)] == [new.id]
    sync.close()


def test_migrate_needs_a_redis_url(tmp_path: Path) -> None:
    result = run_relay("migrate", "--data-dir", tmp_path / "no-server")
    assert result.returncode == 2
    assert (
        "relay is not running here, so `relay migrate` has nothing to read" in result.stderr
        and "--redis-url" in result.stderr
    )
