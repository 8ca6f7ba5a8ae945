"""Test fixtures: a real Redis-protocol server on a free loopback port, started by the test run.

Set ``REDIS_URL`` to run against an existing server instead (tests isolate themselves by key prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from adapters.redis.server import EmbeddedRedis


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
