"""Webhook state in Redis: secrets kept in the registration hash, and the notifier claim. Implements
``broker.webhooks``' ``IWebhookTargets`` and ``IWebhookClaims`` (what a notification announces comes
from ``RedisNoticeStore``, its cursor shared with ``POST /agent/wait``); every key is the agent's (one
cluster slot), see ``adapters.redis.keys``."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.directory import Directory
from adapters.redis.errors import store_error
from adapters.redis.protocol_operator import webhook_release_call, webhook_secret_call
from broker.webhooks import WebhookTarget, is_webhook_endpoint


class RedisWebhooks:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys

    async def set_secret(self, agent: str, session: str, endpoint: str, secret: str) -> bool:
        try:
            call = webhook_secret_call(self.keys, agent, session, endpoint, secret)
            stored = await self.connection.script(
                self.connection.scripts.webhook_secret, call.keys, call.args, idempotent=True, durable=True
            )
        except ResponseError as exc:
            raise store_error(exc) from exc
        return bool(int(str(stored)))

    async def target(self, agent: str) -> WebhookTarget | None:
        key = self.keys.registration(agent)

        async def run(client: Redis | RedisCluster) -> list[str | None]:
            found = await client.hmget(key, ["session", "provider", "endpoint", "webhook_secret"])
            return [None if value is None else str(value) for value in found]

        session, provider, endpoint, secret = await self.connection.call(run, idempotent=True)
        if session is None or provider is None or endpoint is None or not secret:
            return None
        if not is_webhook_endpoint(provider, endpoint):
            return None
        return WebhookTarget(agent, session, endpoint, secret)

    async def agents(self) -> list[str]:
        return await Directory(self.connection).agents()

    async def claim(self, agent: str, holder: str, seconds: float) -> bool:
        key = self.keys.webhook_claim(agent)

        async def run(client: Redis | RedisCluster) -> bool:
            return bool(await client.set(key, holder, nx=True, px=max(1, int(seconds * 1000))))

        return await self.connection.call(run, idempotent=False)

    async def release(self, agent: str, holder: str, answered: str | None = None) -> None:
        try:
            call = webhook_release_call(self.keys, agent, holder, answered)
            await self.connection.script(
                self.connection.scripts.webhook_release, call.keys, call.args, idempotent=True
            )
        except ResponseError as exc:
            raise store_error(exc) from exc
