"""``RedisCredentials``: per-agent credentials (``broker.ports.ICredentials``) in Redis.

Each record lives in its agent's credentials hash (one cluster slot per agent, see
``adapters.redis.keys``): the immutable part as JSON under the id, the last exchange under
``<id>:used`` and the revocation under ``<id>:revoked``, written with ``HSETNX``, so an exchange
recording its use can never undo a revocation that raced it. The id's owner key maps an id to its
agent. Event counts live in one hash shared by every worker and by the ``relay credentials`` command.
"""

from __future__ import annotations

import json
from typing import Any, cast

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection
from broker.credentials import EVENTS, Credential, CredentialEvent, is_credential_id


class RedisCredentials:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys

    async def add(self, credential: Credential) -> None:
        keys = self.keys
        record = json.dumps(
            {
                "agent": credential.agent,
                "label": credential.label,
                "audience": credential.audience,
                "secret_hash": credential.secret_hash,
                "created_at_ms": credential.created_at_ms,
                "expires_at_ms": credential.expires_at_ms,
            }
        )

        async def claim(client: Redis | RedisCluster) -> bool:
            return bool(await client.set(keys.credential_owner(credential.id), credential.agent, nx=True))

        # Not retried: a retry after a lost answer would read the first attempt's claim as a clash.
        if not await self.connection.call(claim, idempotent=False):
            raise ValueError(f"credential {credential.id} already exists")

        async def store(client: Redis | RedisCluster) -> None:
            await client.hset(keys.credentials(credential.agent), credential.id, record)
            await client.sadd(keys.credential_agents(), credential.agent)
            await client.hincrby(keys.credential_events(), "issued", 1)

        await self.connection.call(store, idempotent=False)

    async def _owner(self, credential_id: str) -> str | None:
        if not is_credential_id(credential_id):
            return None  # never a key name built from arbitrary text

        async def run(client: Redis | RedisCluster) -> Any:
            return await client.get(self.keys.credential_owner(credential_id))

        owner = await self.connection.call(run, idempotent=True)
        return None if owner is None else _text(owner)

    async def get(self, credential_id: str) -> Credential | None:
        agent = await self._owner(credential_id)
        if agent is None:
            return None
        fields = [credential_id, f"{credential_id}:used", f"{credential_id}:revoked"]

        async def run(client: Redis | RedisCluster) -> list[Any]:
            return cast(list[Any], await client.hmget(self.keys.credentials(agent), fields))

        raw, used, revoked = await self.connection.call(run, idempotent=True)
        return None if raw is None else _record(credential_id, raw, used, revoked)

    async def listed(self, agent: str | None = None) -> list[Credential]:
        keys = self.keys

        async def agents(client: Redis | RedisCluster) -> list[str]:
            return sorted(_text(a) for a in await client.smembers(keys.credential_agents()))

        names = [agent] if agent is not None else await self.connection.call(agents, idempotent=True)
        found: list[Credential] = []
        for name in names:

            async def run(client: Redis | RedisCluster, name: str = name) -> dict[Any, Any]:
                return cast(dict[Any, Any], await client.hgetall(keys.credentials(name)))

            fields = {_text(k): v for k, v in (await self.connection.call(run, idempotent=True)).items()}
            for ident, raw in fields.items():
                if is_credential_id(ident):
                    found.append(
                        _record(ident, raw, fields.get(f"{ident}:used"), fields.get(f"{ident}:revoked"))
                    )
        return sorted(found, key=lambda c: (c.created_at_ms, c.id))

    async def revoke(self, credential_id: str, at_ms: int) -> Credential | None:
        record = await self.get(credential_id)
        if record is None:
            return None
        keys = self.keys

        async def run(client: Redis | RedisCluster) -> bool:
            first = bool(
                await client.hsetnx(keys.credentials(record.agent), f"{credential_id}:revoked", at_ms)
            )
            if first:
                await client.hincrby(keys.credential_events(), "revoked", 1)
            return first

        # HSETNX is safe to repeat; the count is only added by the call that set the field
        await self.connection.call(run, idempotent=False)
        return await self.get(credential_id)

    async def used(self, credential_id: str, at_ms: int) -> None:
        agent = await self._owner(credential_id)
        if agent is None:
            return
        keys = self.keys

        async def run(client: Redis | RedisCluster) -> None:
            await client.hset(keys.credentials(agent), f"{credential_id}:used", at_ms)
            await client.hincrby(keys.credential_events(), "exchanged", 1)

        await self.connection.call(run, idempotent=False)

    async def count(self, event: CredentialEvent) -> None:
        async def run(client: Redis | RedisCluster) -> None:
            await client.hincrby(self.keys.credential_events(), event, 1)

        await self.connection.call(run, idempotent=False)

    async def events(self) -> dict[CredentialEvent, int]:
        async def run(client: Redis | RedisCluster) -> dict[Any, Any]:
            return cast(dict[Any, Any], await client.hgetall(self.keys.credential_events()))

        counts = {_text(k): int(v) for k, v in (await self.connection.call(run, idempotent=True)).items()}
        return {event: counts.get(event, 0) for event in EVENTS}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(ident: str, raw: Any, used: Any, revoked: Any) -> Credential:
    data = json.loads(raw)
    return Credential(
        id=ident,
        agent=data["agent"],
        label=data["label"],
        audience=data["audience"],
        secret_hash=data["secret_hash"],
        created_at_ms=int(data["created_at_ms"]),
        expires_at_ms=None if data["expires_at_ms"] is None else int(data["expires_at_ms"]),
        last_used_at_ms=None if used is None else int(used),
        revoked_at_ms=None if revoked is None else int(revoked),
    )
