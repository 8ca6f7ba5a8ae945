"""``RedisRegistry``: one hash per agent (see docs/redis-layout.md); semantics of ``IRegistry``.

Registering and retiring also keep the directory's index (``adapters/redis/directory.py``), in the
order that keeps it a superset of the registrations: the id in before ``register.lua``, out only after
``retire.lua``; ``list`` reads a page of it and the registration of each id, dropping ids without one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.directory import MAX_PAGES, Directory
from adapters.redis.entries import tier_of
from adapters.redis.errors import Refused, refusal
from adapters.redis.inbox import purge_inbox
from adapters.redis.protocol_operator import (
    Registered,
    Retirement,
    leave_call,
    register_call,
    retire_call,
)
from broker.addresses import Address
from broker.envelope import now_ms, parse_ms
from broker.ports import RegisterOutcome, Registration, Retired

_LEAST_READ = 64
"""Index ids one round of ``RedisRegistry.list`` reads at least."""


class RedisRegistry:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.backend = connection
        """``Relay`` opens and closes it (once for all the stores on it)."""
        self.keys = connection.keys
        self.directory = Directory(connection)

    async def register(self, agent: str, address: Address, session: str) -> RegisterOutcome:
        now = now_ms()
        call = register_call(self.keys, agent, address, session, now=now)
        await self.directory.enter(agent)  # first: the directory never lacks a registration
        try:
            reply = Registered.read(
                await self.connection.script(
                    self.connection.scripts.register, call.keys, call.args, idempotent=True, durable=True
                )
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session)) from exc
        if reply.created:  # a retirement may have taken the id out since the first (Directory's module)
            await self.directory.enter(agent)
        registration = Registration(
            agent=agent,
            provider=address.provider,
            endpoint=address.endpoint,
            tier=address.tier,
            session=session,
            registered_at_ms=parse_ms(reply.registered_at),
            updated_at_ms=now,
        )
        superseded = reply.previous if reply.previous and reply.previous != session else None
        return RegisterOutcome(registration, reply.created, superseded)

    async def get(self, agent: str) -> Registration | None:
        key = self.keys.registration(agent)

        async def run(client: Redis | RedisCluster) -> dict[str, str]:
            found = await client.hgetall(key)
            return {str(k): str(v) for k, v in found.items()}

        found = await self.connection.call(run, idempotent=True)
        return _registration(agent, found) if found else None

    async def list(self, limit: int = 1000, after: str | None = None) -> list[Registration]:
        found: list[Registration] = []
        for _ in range(MAX_PAGES):
            if len(found) >= limit:
                break
            # a few more than needed, so that ids without a registration rarely cost another round
            agents, more = await self.directory.candidates(after, max(limit - len(found), _LEAST_READ))
            found += await _rows(self.connection, agents)
            if not more:
                break
            after = agents[-1]
        return found[:limit]

    async def leave(self, agent: str, session: str) -> bool:
        call = leave_call(self.keys, agent, session)
        try:
            noted = await self.connection.script(
                self.connection.scripts.leave, call.keys, call.args, idempotent=True
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session)) from exc
        return bool(int(str(noted)))

    async def retire(self, agent: str, *, purge: bool = False) -> Retired:
        connection = self.connection
        call = retire_call(self.keys, agent, purge=purge)
        try:
            reply = Retirement.read(
                await connection.script(
                    connection.scripts.retire, call.keys, call.args, idempotent=True, durable=True
                )
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent)) from exc
        await self.directory.leave(agent)  # only now: the registration is gone
        purged = await purge_inbox(connection, agent, reply.newest) if reply.newest else 0
        return Retired(agent, reply.sessions, reply.now, purged)


async def _rows(connection: RedisConnection, agents: Sequence[str]) -> list[Registration]:
    """The registrations of ``agents`` that have one, in order."""
    keys = connection.keys

    async def run(client: Redis | RedisCluster) -> list[Registration]:
        pipe = client.pipeline(transaction=False)
        for agent in agents:
            pipe.hgetall(keys.registration(agent))
        found = await pipe.execute()
        return [
            _registration(a, {str(k): str(v) for k, v in row.items()})
            for a, row in zip(agents, found, strict=True)
            if row
        ]

    return await connection.call(run, idempotent=True) if agents else []


def _registration(agent: str, row: Mapping[str, str]) -> Registration:
    return Registration(
        agent=agent,
        provider=row.get("provider", ""),
        endpoint=row.get("endpoint", ""),
        tier=tier_of(row.get("tier", "network")),
        session=row.get("session", ""),
        registered_at_ms=parse_ms(row["registered_at"]),
        updated_at_ms=parse_ms(row["updated_at"]),
        last_seen_ms=seen_at_ms(row),
        superseded=tuple(row.get("superseded", "").split()),
        ended_at_ms=ms_field(row, "ended_at"),
    )


def seen_at_ms(row: Mapping[str, str]) -> int | None:
    """The registration hash's ``seen_at`` (milliseconds of Redis ``TIME``, written by the register,
    fetch, ack, notice and webhook release scripts); None when absent."""
    return ms_field(row, "seen_at")


def ms_field(row: Mapping[str, str], name: str) -> int | None:
    """A registration hash's field of milliseconds (``seen_at``, ``ended_at``); None when absent."""
    text = row.get(name, "")
    return int(text) if text.isdigit() else None


async def is_retired(connection: RedisConnection, agent: str) -> bool:
    """Whether ``agent`` was retired (``retire.lua``) and not registered again since: the operator
    commands still read what it left (inbox, dead letters, history)."""
    key = connection.keys.retired(agent)

    async def run(client: Redis | RedisCluster) -> bool:
        return bool(await client.exists(key))

    return await connection.call(run, idempotent=True)
