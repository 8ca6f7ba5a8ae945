"""The spent-token conformance suite (``broker.testing.spent_conformance``) on both backends and a
Redis Cluster, and what only Redis promises: a restart forgets no spent id, and each one expires."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator

import pytest

from adapters.memory.spent import MemorySpentTokens
from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.spent import RedisSpentTokens
from broker.ports import ISpentTokens
from broker.testing.spent_conformance import HOUR_MS, SpentTokensConformance
from tests.support import unique_prefix


class TestMemorySpentTokens(SpentTokensConformance):
    @contextlib.asynccontextmanager
    async def make_stores(self, count: int) -> AsyncIterator[list[ISpentTokens]]:
        store = MemorySpentTokens()
        yield [store] * count


class TestRedisSpentTokens(SpentTokensConformance):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url
        self.prefix = unique_prefix()

    @contextlib.asynccontextmanager
    async def make_stores(self, count: int) -> AsyncIterator[list[ISpentTokens]]:
        connections = [RedisConnection(RedisSettings(url=self.url, prefix=self.prefix)) for _ in range(count)]
        try:
            yield [RedisSpentTokens(connection) for connection in connections]
        finally:
            for connection in connections:
                await connection.close()

    async def test_a_restart_forgets_no_spent_id_and_each_one_expires(self) -> None:
        async with self.make_stores(1) as (before,):
            assert await before.spend("login-1", HOUR_MS)
        connection = RedisConnection(RedisSettings(url=self.url, prefix=self.prefix))
        try:
            # a new process on the same Redis
            assert not await RedisSpentTokens(connection).spend("login-1", HOUR_MS)
            key = connection.keys.spent_token(hashlib.sha256(b"login-1").hexdigest())
            assert 0 < await connection.call(lambda client: client.pttl(key), idempotent=True) <= HOUR_MS
        finally:
            await connection.close()


class TestRedisClusterSpentTokens(TestRedisSpentTokens):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url
        self.prefix = unique_prefix()
