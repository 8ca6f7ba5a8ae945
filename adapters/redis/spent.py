"""``RedisSpentTokens``: spent single-use token ids (``broker.ports.ISpentTokens``) in Redis, one key
per id (``SET NX PX``), so every worker on the Redis sees a spend at once and a restart forgets none."""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection


class RedisSpentTokens:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    async def spend(self, token_id: str, ttl_ms: int) -> bool:
        # Hashed: the key has a fixed length and shape, whatever the signed token named as its id.
        key = self.connection.keys.spent_token(hashlib.sha256(token_id.encode()).hexdigest())

        async def run(client: Redis | RedisCluster) -> bool:
            return bool(await client.set(key, "1", nx=True, px=max(1, ttl_ms)))

        # Not retried: a retry after a lost answer would read the first attempt's write as a spend.
        return await self.connection.call(run, idempotent=False)
