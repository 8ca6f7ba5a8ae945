"""What a caller is told when the store fails: out of memory is retryable and says so, and no message
carries where a script failed (SHA, function name, line), whatever the Redis version's spelling."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import OutOfMemoryError, ResponseError

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.errors import store_error
from broker.envelope import Tier
from broker.errors import BackendRefused, BackendUnavailable
from tests.support import address_for, note, relay_on


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis()
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


SHA = "8f2a1c0b9d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"
WHERE = re.compile(r"[0-9a-f]{40}|user_script|user_function|relay_[0-9a-f]{12}|f_[0-9a-f]{8}|:\d+:")


@pytest.mark.parametrize(
    "exc",
    [
        OutOfMemoryError(
            f"OOM command not allowed when used memory > 'maxmemory'. script: {SHA}, on @user_script:12."
        ),
        ResponseError(
            f"OOM command not allowed when used memory > 'maxmemory'. script: {SHA}, on @user_script:12."
        ),
        ResponseError(
            f"Error running script (call to f_{SHA}): @user_script:12: -OOM command not allowed when used "
            "memory > 'maxmemory'."
        ),
        ResponseError(  # a function's spelling
            "OOM command not allowed when used memory > 'maxmemory'. script: relay_0123456789ab_send, on "
            "@user_function:462."
        ),
    ],
)
def test_out_of_memory_is_retryable_and_names_no_script(exc: Exception) -> None:
    error = store_error(exc)
    assert isinstance(error, BackendUnavailable) and error.retryable
    assert "out of memory" in error.message and not WHERE.search(error.message), error.message


def test_a_server_without_functions_is_told_apart() -> None:
    """Redis before 7.0 has no ``FCALL``: the caller learns what relay needs, not a bare refusal."""
    error = store_error(
        ResponseError("unknown command 'FCALL', with args beginning with: 'relay_0123456789ab_send'")
    )
    assert isinstance(error, BackendRefused) and not error.retryable
    assert "Redis 7.0 or later" in error.message


def test_other_script_errors_name_no_script_either() -> None:
    error = store_error(
        ResponseError(
            f"Error running script (call to f_{SHA}): @user_script:7: WRONGTYPE Operation against a key"
        )
    )
    assert isinstance(error, BackendRefused) and "WRONGTYPE" in error.message
    assert not WHERE.search(error.message), error.message


async def test_a_store_at_maxmemory_answers_a_clean_retryable_error(server: EmbeddedRedis) -> None:
    sync = redis.Redis.from_url(server.url, decode_responses=True)
    async with relay_on(server.url) as relay:
        for name in ("alice", "bob"):
            await relay.register(name, address_for(Tier.HOST, name), "s")
        sync.config_set("maxmemory", 1)
        try:
            for attempt in (
                relay.send("alice", "bob", note(0)),
                relay.register("carol", address_for(Tier.HOST, "carol"), "s"),
            ):
                with pytest.raises(BackendUnavailable) as refused:
                    await attempt
                assert refused.value.retryable and "out of memory" in refused.value.message
                assert not WHERE.search(refused.value.message), refused.value.message
        finally:
            sync.config_set("maxmemory", 0)
        assert await relay.ready()
    sync.close()
