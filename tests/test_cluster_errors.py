"""A Redis Cluster that is not ready (a slot moving, a failover, a node loading) is named by its
condition in the caller's error, never by the first word of redis-py's message: on the real test
cluster with a slot left half-migrated, and for each condition as redis-py raises it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ClusterError, SlotNotCoveredError, TryAgainError

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.errors import store_error
from adapters.redis.keys import Keys
from broker.agent_message import AgentMessageContract
from broker.envelope import Tier
from broker.errors import BackendUnavailable
from broker.relay import Relay
from tests.cluster_support import LocalCluster, set_slot, slot_move
from tests.support import address_for, unique_prefix

REPLIES = {
    "TRYAGAIN": "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN": "CLUSTERDOWN The cluster is down",
    "MASTERDOWN": "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "MOVED": "MOVED 3999 127.0.0.1:6381",
    "ASK": "ASK 3999 127.0.0.1:6381",
    "READONLY": "READONLY You can't write against a read only replica.",
    "LOADING": "LOADING Redis is loading the dataset in memory",
}


@pytest.mark.parametrize("condition", sorted(REPLIES))
def test_each_condition_is_named_as_redis_spells_it(condition: str) -> None:
    exc = BaseParser.parse_error(REPLIES[condition])  # type: ignore[no-untyped-call]  # what redis-py raises
    error = store_error(exc)
    assert isinstance(error, BackendUnavailable) and error.retryable
    assert f"({condition}: " in error.message, error.message
    assert "nothing was written" in error.message


@pytest.mark.parametrize(
    ("exc", "condition"),
    [
        (TryAgainError("Multiple keys request during rehashing of slot"), "TRYAGAIN"),  # redis-py 5
        (ClusterError("TTL exhausted."), "TTL exhausted"),
        (SlotNotCoveredError('Slot "3999" is not covered by the cluster.'), "CLUSTERDOWN"),
    ],
)
def test_what_the_cluster_client_raises_itself_is_named_too(exc: Exception, condition: str) -> None:
    error = store_error(exc)
    assert isinstance(error, BackendUnavailable) and f"({condition}: " in error.message, error.message


@contextlib.contextmanager
def half_migrated(cluster: LocalCluster, key: str) -> Iterator[None]:
    """``key``'s slot marked MIGRATING on its master and IMPORTING on another, as a resharding leaves
    it between steps: a script whose keys are partly on each side gets TRYAGAIN. Set back after."""
    move = slot_move(cluster, key)
    try:
        set_slot(move.target_port, move.slot, "IMPORTING", move.source_id)
        set_slot(move.source_port, move.slot, "MIGRATING", move.target_id)
        yield
    finally:
        for port in (move.source_port, move.target_port):
            set_slot(port, move.slot, "STABLE")


async def test_a_slot_being_moved_is_named_on_the_real_cluster(redis_cluster: LocalCluster) -> None:
    prefix = unique_prefix()
    settings = RedisSettings(url=redis_cluster.url, prefix=prefix, command_timeout=1.0)
    connection = RedisConnection(settings)
    relay = Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection))
    async with relay:
        await relay.register("bob", address_for(Tier.HOST, "bob"), "s-bob")
        # the registration and inbox exist on the source, the dead letters and counts nowhere
        with (
            half_migrated(redis_cluster, Keys(prefix).inbox("bob")),
            pytest.raises(BackendUnavailable) as refused,
        ):
            await relay.fetch("bob", 16, session="s-bob")
        assert "(TRYAGAIN: a slot is being moved between nodes)" in refused.value.message
        assert refused.value.retryable and "Multiple" not in refused.value.message
        assert await relay.fetch("bob", 16, session="s-bob") == []
