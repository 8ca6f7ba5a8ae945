"""The credential-store conformance suite (``broker.testing.credentials_conformance``) on the memory
twin, one Redis and a Redis Cluster, and what only Redis shows: no record holds the secret."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from adapters.memory.credentials import MemoryCredentials
from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.credentials import RedisCredentials
from broker.credentials import new_credential, split
from broker.ports import ICredentials
from broker.testing.credentials_conformance import NOW_MS, CredentialsConformance
from tests.support import unique_prefix


class TestMemoryCredentials(CredentialsConformance):
    @contextlib.asynccontextmanager
    async def make_stores(self, count: int) -> AsyncIterator[list[ICredentials]]:
        store = MemoryCredentials()
        yield [store] * count


class TestRedisCredentials(CredentialsConformance):
    @pytest.fixture(autouse=True)
    def _url(self, redis_url: str) -> None:
        self.url = redis_url
        self.prefix = unique_prefix()

    @contextlib.asynccontextmanager
    async def make_stores(self, count: int) -> AsyncIterator[list[ICredentials]]:
        connections = [RedisConnection(RedisSettings(url=self.url, prefix=self.prefix)) for _ in range(count)]
        try:
            yield [RedisCredentials(connection) for connection in connections]
        finally:
            for connection in connections:
                await connection.close()

    async def test_redis_holds_the_hash_never_the_secret(self) -> None:
        connection = RedisConnection(RedisSettings(url=self.url, prefix=self.prefix))
        try:
            record, text = new_credential("alice", now_ms=NOW_MS)
            await RedisCredentials(connection).add(record)
            parts = split(text)
            assert parts is not None
            key = connection.keys.credentials("alice")
            stored = await connection.call(lambda client: client.hgetall(key), idempotent=True)
            dump = repr(stored)
            assert record.secret_hash in dump and parts[1] not in dump
        finally:
            await connection.close()


class TestRedisClusterCredentials(TestRedisCredentials):
    @pytest.fixture(autouse=True)
    def _url(self, cluster_url: str) -> None:
        self.url = cluster_url
        self.prefix = unique_prefix()
