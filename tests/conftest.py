"""Test fixtures: a real Redis-protocol server on a free loopback port, started by the test run.

Set ``REDIS_URL`` to run against an existing server instead (tests isolate themselves by key prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.redis.embedded import EmbeddedRedis
from tests.cluster_support import LocalCluster, find_cli


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis | None]:
    if os.environ.get("REDIS_URL"):
        yield None
        return
    server = EmbeddedRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis | None) -> str:
    if redis_server is None:
        return os.environ["REDIS_URL"]
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster on loopback: 3 masters with a replica each, started for the test run and
    stopped (by PID) after it. Skipped, with the reason, where redis-cli is not installed."""
    if find_cli() is None:
        pytest.skip("redis-cli is not installed (apt-get install redis-tools); .ci/run installs it")
    cluster = LocalCluster(masters=3, replicas=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_url(redis_cluster: LocalCluster) -> str:
    """The URL of one node of the test cluster (any node is a way in)."""
    return redis_cluster.url


@pytest.fixture(scope="module")
def threaded(redis_url: str) -> Iterator[Any]:
    """The real app on uvicorn in a background thread, for synchronous (hypothesis) tests."""
    from tests.rpc_support import ThreadedFront  # (loads the app and the MCP SDK only when used)

    with ThreadedFront(redis_url) as running:
        yield running


@pytest.fixture(scope="module")
def store(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client on the test server, to look at what the relay stored."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
    try:
        yield client
    finally:
        client.close()
