"""``RedisInboxStore``: one stream per agent with a consumer group; semantics of ``IInboxStore``.

Every script call touches one agent's keys (one hash slot), so the store runs on one Redis or a
cluster alike (docs/redis-layout.md):

- send: ``send_check`` on the sender's slot (registration, session, rate token; returns its tier),
  then ``send_append`` on the recipient's slot (registration, cap, ``XADD``, wake-up). When step 2
  refuses, ``send_refund`` gives the rate token back, so a refused send leaves nothing behind.
- fetch and acknowledge: one script each on the agent's slot.
- a long-poll parks on the worker's wake-ups (``adapters/redis/wake.py``) and runs the fetch script
  again when woken: no Redis connection is held while it waits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence

from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import entry_id, envelope_id, rows, tier_of
from adapters.redis.keys import GROUP
from broker.envelope import Tier, format_ms
from broker.errors import (
    BackendRefused,
    InboxFull,
    RateLimited,
    RelayError,
    SessionNotRegistered,
    SessionSuperseded,
    UnknownRecipient,
    UnregisteredAgent,
)
from broker.ids import new_nonce
from broker.ports import AckOutcome, Appended, StoredEnvelope


class RedisInboxStore:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def ping(self) -> bool:
        return await self.connection.ping()

    def parked(self, agent: str | None = None) -> int:
        return self.connection.wakeups.count(agent)

    async def append(
        self,
        sender: str,
        to: str,
        fields: Mapping[str, str],
        *,
        sent_at_ms: int,
        sender_session: str | None = None,
    ) -> Appended:
        connection, keys, scripts = self.connection, self.keys, self.connection.scripts
        settings = connection.settings
        rate_key = keys.rate(sender)
        try:
            tier = await connection.script(
                scripts.send_check,
                [keys.registration(sender), rate_key],
                [sender_session or "", repr(float(settings.send_rate)), settings.send_burst],
                idempotent=False,
            )
        except ResponseError as exc:
            raise _refusal(exc, sender, sender_session, to) from exc
        nonce = new_nonce()
        route = (keys.wake_channel(), to)
        body: list[str] = []
        for name, value in fields.items():
            body += (name, value)
        try:
            stream_id, tier = await connection.script(
                scripts.send_append,
                [keys.registration(to), keys.inbox(to)],
                [sender, tier, format_ms(sent_at_ms), nonce, settings.inbox_cap, GROUP, *route, *body],
                idempotent=False,
                durable=True,
            )
        except ResponseError as exc:
            refusal = _refusal(exc, sender, sender_session, to)
            if settings.send_rate > 0:
                with contextlib.suppress(RelayError):  # not refunded: one token less, never one more
                    await connection.script(
                        scripts.send_refund, [rate_key], [settings.send_burst], idempotent=False
                    )
            raise refusal from exc
        return Appended(envelope_id(str(stream_id), nonce), tier_of(str(tier)), sent_at_ms)

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> list[StoredEnvelope]:
        found = await self._fetch(agent, limit, session)
        if found or not wait or wait <= 0:
            return found
        deadline = time.monotonic() + min(wait, self.connection.settings.max_block)
        with self.connection.wakeups.park(agent) as parked:
            while True:
                parked.rearm()
                found = await self._fetch(agent, limit, session)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0 or not await parked.wait(remaining):
                    return found

    async def _fetch(self, agent: str, limit: int, session: str | None) -> list[StoredEnvelope]:
        connection, keys = self.connection, self.keys
        try:
            reply = await connection.script(
                connection.scripts.fetch,
                [keys.registration(agent), keys.inbox(agent)],
                [session or "", GROUP, agent, limit],
                idempotent=True,
            )
        except ResponseError as exc:
            raise _refusal(exc, agent, session, agent) from exc
        return rows(agent, reply)

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        if not ids:
            return AckOutcome()
        args: list[str] = [session or "", GROUP]
        for one in ids:
            args += entry_id(one)
        connection, keys = self.connection, self.keys
        try:
            replies = await connection.script(
                connection.scripts.ack,
                [keys.registration(agent), keys.inbox(agent)],
                args,
                idempotent=True,
                durable=True,
            )
        except ResponseError as exc:
            raise _refusal(exc, agent, session, agent) from exc
        acknowledged: list[str] = []
        origins: list[tuple[str, Tier]] = []
        unknown: list[str] = []
        for one, reply in zip(ids, replies, strict=True):
            if isinstance(reply, list):
                acknowledged.append(one)
                origins.append((str(reply[0]), tier_of(str(reply[1]))))
            else:
                unknown.append(one)
        return AckOutcome(tuple(acknowledged), tuple(unknown), tuple(origins))


def _refusal(exc: ResponseError, agent: str, session: str | None, to: str) -> RelayError:
    text = str(exc)
    if text.startswith("RELAY_UNREGISTERED"):
        return UnregisteredAgent(agent)
    if text.startswith("RELAY_SUPERSEDED"):
        return SessionSuperseded(agent, session or "")
    if text.startswith("RELAY_SESSION_UNREGISTERED"):
        return SessionNotRegistered(agent, session or "")
    if text.startswith("RELAY_UNKNOWN_RECIPIENT"):
        return UnknownRecipient(to)
    if text.startswith("RELAY_INBOX_FULL"):
        _, cap, depth = text.split()[:3]
        return InboxFull(to, int(cap), int(depth))
    if text.startswith("RELAY_RATE_LIMITED"):
        return RateLimited(agent, int(text.split()[1]) / 1000)
    return BackendRefused(f"the message store refused the operation ({text[:200]})")
