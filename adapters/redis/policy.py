"""``RedisPolicyStore``: contact policies (``broker.ports.IPolicyStore``) in one hash per recipient, on
its slot (``Keys.policy``), so ``send_append.lua`` checks a send against it atomically with the
append, on one Redis or a cluster alike. ``policy_set.lua`` replaces a policy in one step."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection
from broker.policy import DEFAULT_POLICY, LIST, OPEN, ContactPolicy, PolicySummary

KIND, LISTED = "=accept_from", "=listed"
"""The policy hash's own fields; every other field is a listed agent id (which never starts with '=')."""
SUMMARY_CHUNK = 500
"""Agents read per pipeline by ``summaries``."""


class RedisPolicyStore:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def get(self, agent: str) -> ContactPolicy:
        key = self.keys.policy(agent)

        async def run(client: Redis | RedisCluster) -> dict[str, str]:
            found = await client.hgetall(key)
            return {str(k): str(v) for k, v in found.items()}

        found = await self.connection.call(run, idempotent=True)
        return _policy(found.get(KIND, OPEN), [f for f in found if not f.startswith("=")])

    async def set(self, agent: str, policy: ContactPolicy) -> ContactPolicy:
        connection = self.connection
        ids = sorted(policy.agents) if policy.accept_from == LIST else []
        # not retried: a second run after a lost answer would report the new policy as the old one
        old = await connection.script(
            connection.scripts.policy_set,
            [self.keys.policy(agent)],
            [policy.accept_from, *ids],
            idempotent=False,
            durable=True,
        )
        return _policy(str(old[0]), [str(x) for x in old[1:]])

    async def summaries(self, agents: Sequence[str]) -> list[PolicySummary]:
        keys = [self.keys.policy(agent) for agent in agents]
        out: list[PolicySummary] = []
        for start in range(0, len(keys), SUMMARY_CHUNK):
            chunk = keys[start : start + SUMMARY_CHUNK]

            async def run(client: Redis | RedisCluster, chunk: list[str] = chunk) -> list[list[str | None]]:
                pipe = client.pipeline(transaction=False)
                for key in chunk:
                    pipe.hmget(key, [KIND, LISTED])
                return [[None if v is None else str(v) for v in row] for row in await pipe.execute()]

            for kind, listed in await self.connection.call(run, idempotent=True):
                out.append(PolicySummary(kind or OPEN, int(listed or 0) if kind == LIST else 0))
        return out


def _policy(kind: str, ids: list[str]) -> ContactPolicy:
    if kind == OPEN:
        return DEFAULT_POLICY
    return ContactPolicy(kind, frozenset(ids) if kind == LIST else frozenset())
