"""``RedisRegistry``: one hash per agent (see docs/redis-layout.md); semantics of ``IRegistry``."""

from __future__ import annotations

from collections.abc import Mapping

from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.keys import GROUP
from broker.addresses import Address
from broker.envelope import Tier, format_time, from_ms, now_ms, parse_time
from broker.errors import BackendUnavailable
from broker.ports import RegisterOutcome, Registration


class RedisRegistry:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def ping(self) -> bool:
        return await self.connection.ping()

    async def register(self, agent: str, address: Address, session: str) -> RegisterOutcome:
        now = format_time(from_ms(now_ms()))
        keys = self.keys

        async def run() -> list[object]:
            reply: list[object] = await self.connection.scripts.register(
                keys=[keys.registration(agent), keys.inbox(agent), keys.agents()],
                args=[agent, address.provider, address.endpoint, address.tier.label, session, now, GROUP],
            )
            return reply

        try:
            previous, registered_at, created = await self.connection.call(run, idempotent=True)
        except ResponseError as exc:
            raise BackendUnavailable(f"registration failed: {exc}") from exc
        registration = Registration(
            agent=agent,
            provider=address.provider,
            endpoint=address.endpoint,
            tier=address.tier,
            session=session,
            registered_at=parse_time(str(registered_at)),
            updated_at=parse_time(now),
        )
        superseded = str(previous) if previous and previous != session else None
        return RegisterOutcome(registration, bool(int(str(created))), superseded)

    async def get(self, agent: str) -> Registration | None:
        key = self.keys.registration(agent)

        async def run() -> dict[str, str]:
            found = await self.connection.client.hgetall(key)
            return {str(k): str(v) for k, v in found.items()}

        found = await self.connection.call(run, idempotent=True)
        return _registration(agent, found) if found else None

    async def list(self, limit: int = 1000) -> list[Registration]:
        async def run() -> list[Registration]:
            members = await self.connection.client.smembers(self.keys.agents())
            agents = sorted(str(m) for m in members)[:limit]
            pipe = self.connection.client.pipeline(transaction=False)
            for agent in agents:
                pipe.hgetall(self.keys.registration(agent))
            rows = await pipe.execute()
            return [
                _registration(a, {str(k): str(v) for k, v in row.items()})
                for a, row in zip(agents, rows, strict=True)
                if row
            ]

        return await self.connection.call(run, idempotent=True)


def _registration(agent: str, row: Mapping[str, str]) -> Registration:
    return Registration(
        agent=agent,
        provider=row.get("provider", ""),
        endpoint=row.get("endpoint", ""),
        tier=Tier.from_label(row.get("tier", "network")),
        session=row.get("session", ""),
        registered_at=parse_time(row["registered_at"]),
        updated_at=parse_time(row["updated_at"]),
    )
