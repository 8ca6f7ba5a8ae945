"""``RedisInboxStore``: one stream per agent with a consumer group; semantics of ``IInboxStore``.

Every script call touches one agent's keys (one hash slot), so the store runs on one Redis or a
cluster alike (docs/redis-layout.md):

- send: ``send_check`` on the sender's slot (registration, session, idempotency claim, rate token,
  status index; returns its tier), then ``send_append`` on the recipient's slot (idempotency record,
  registration, cap, ``XADD``, wake-up). When step 2 refuses, ``send_refund`` undoes step 1, so a
  refused send leaves nothing behind.
- fetch and acknowledge: one script each on the agent's slot; fetch moves expired and too often
  delivered envelopes to the dead letters on the way.
- status: ``status_index`` on the sender's slot (which ids it sent, to whom), then ``status`` on each
  recipient's slot.
- a long-poll parks on the worker's wake-ups (``adapters/redis/wake.py``) and runs the fetch script
  again when woken: no Redis connection is held while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import entry_id, envelope_id, rows, tier_of
from adapters.redis.errors import Refused, refusal
from adapters.redis.keys import GROUP
from adapters.redis.protocol import SendAppended, SendCall, SendChecked, send_call, with_refund, with_tier
from broker.envelope import Tier, format_ms, now_ms
from broker.errors import RelayError
from broker.ids import decode_envelope_id, new_nonce
from broker.limits import REQUEUE_LINEAGE
from broker.ports import AckOutcome, Appended, Fetched, MessageStatus, SendOptions

DAY_MS: Final = 24 * 3600 * 1000
SKEW_MS: Final = 5 * 60 * 1000
"""A send is noted under its worker's day; its entry id carries Redis's time. Status looks at the days
this far either side, so clocks this far apart still find it."""
_NO_OPTIONS: Final = SendOptions()


def retained_until(day: int, retention_ms: int) -> int:
    """When a status key of ``day`` (a sent index, an outcome hash) expires, in ms since the epoch: the
    status retention after the day ends, plus the clocks' skew; 0 when no status is kept."""
    return (day + 1) * DAY_MS + retention_ms + SKEW_MS if retention_ms > 0 else 0


def outcome_hash(connection: RedisConnection, agent: str, now: int) -> tuple[str, int]:
    """The outcome hash of ``agent``'s inbox for a record written at ``now`` (ms, the worker's clock),
    and when it expires (0: keep no record)."""
    day = now // DAY_MS
    return connection.keys.outcomes(agent, day), retained_until(day, connection.settings.status_retention_ms)


class RedisInboxStore:
    def __init__(self, connection: RedisConnection, *, clock: Callable[[], int] = now_ms) -> None:
        self.connection = connection
        self.keys = connection.keys
        self.clock = clock

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
        options: SendOptions = _NO_OPTIONS,
    ) -> Appended:
        connection = self.connection
        day = sent_at_ms // DAY_MS
        call = send_call(
            self.keys,
            connection.settings,
            sender,
            to,
            fields,
            sent_at_ms=sent_at_ms,
            session=sender_session,
            options=options,
            nonce=new_nonce(),
            day=day,
            index_until=retained_until(day, connection.settings.status_retention_ms),
        )
        try:
            if connection.single_node:
                # one Redis: all steps in one script call built from the same sources, one round trip
                one = call.combined()
                reply = SendAppended.read(
                    await connection.script(
                        connection.scripts.send, one.keys, one.args, idempotent=False, durable=True
                    )
                )
            else:
                reply = await self._two_steps(call)
        except ResponseError as exc:
            who = Refused(sender, sender_session, to, options.idempotency_key)
            raise refusal(exc, who) from exc
        return Appended(
            envelope_id(reply.stream_id, reply.nonce), tier_of(reply.tier), reply.sent_at_ms, reply.repeat
        )

    async def _two_steps(self, call: SendCall) -> SendAppended:
        """A send on a cluster: step 1 on the sender's slot, step 2 on the recipient's, and the undo
        (or the status note) on the sender's slot again (see docs/redis-layout.md)."""
        connection, scripts = self.connection, self.connection.scripts
        check = call.check
        checked = SendChecked.read(
            await connection.script(scripts.send_check, check.keys, check.args, idempotent=False)
        )
        append = with_tier(call.append, checked.tier)
        try:
            reply = SendAppended.read(
                await connection.script(
                    scripts.send_append, append.keys, append.args, idempotent=False, durable=True
                )
            )
        except ResponseError:
            with contextlib.suppress(RelayError):  # not undone: one token less, never one more
                refund = with_refund(call.refund, checked.refund_burst)
                await connection.script(scripts.send_refund, refund.keys, refund.args, idempotent=False)
            raise
        if checked.repeat and not reply.repeat and call.note is not None:
            # the first attempt claimed the key but never landed: this one did, so note it for status
            await connection.script(scripts.send_note, call.note.keys, call.note.args, idempotent=True)
        return reply

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> Fetched:
        found = await self._fetch(agent, limit, session)
        if found.envelopes or not wait or wait <= 0:
            return found
        deadline = time.monotonic() + min(wait, self.connection.settings.max_block)
        with self.connection.wakeups.park(agent) as parked:
            while True:
                parked.rearm()
                more = await self._fetch(agent, limit, session)
                found = Fetched(more.envelopes, found.dead_lettered + more.dead_lettered)
                remaining = deadline - time.monotonic()
                if found.envelopes or remaining <= 0 or not await parked.wait(remaining):
                    return found

    async def _fetch(self, agent: str, limit: int, session: str | None) -> Fetched:
        connection, keys = self.connection, self.keys
        settings = connection.settings
        now = self.clock()
        outcomes, until = outcome_hash(connection, agent, now)
        try:
            reply, dropped = await connection.script(
                connection.scripts.fetch,
                [
                    keys.registration(agent),
                    keys.inbox(agent),
                    keys.dead_letters(agent),
                    outcomes,
                    keys.delivery_counts(agent),
                ],
                [session or "", GROUP, agent, limit, now, settings.max_deliveries, format_ms(now), until],
                idempotent=True,
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session, agent)) from exc
        return Fetched(rows(agent, reply), _dropped(dropped))

    async def sweep(self, agent: str, limit: int) -> list[tuple[Tier, str]]:
        connection, keys = self.connection, self.keys
        now = self.clock()
        outcomes, until = outcome_hash(connection, agent, now)
        try:
            dropped = await connection.script(
                connection.scripts.sweep,
                [keys.inbox(agent), keys.dead_letters(agent), outcomes, keys.delivery_counts(agent)],
                [GROUP, now, format_ms(now), until, limit],
                idempotent=True,
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, None, agent)) from exc
        return list(_dropped(dropped))

    async def status(
        self, sender: str, ids: Sequence[str], *, session: str | None = None
    ) -> list[MessageStatus]:
        connection, keys = self.connection, self.keys
        retention = connection.settings.status_retention_ms
        now = self.clock()
        index_keys = [keys.registration(sender)]
        positions: dict[int, int] = {}
        args: list[str | int] = [session or ""]
        for one in ids:
            ms, _, nonce = decode_envelope_id(one)
            days = sorted({(ms - SKEW_MS) // DAY_MS, (ms + SKEW_MS) // DAY_MS})
            for day in days:
                if day not in positions:
                    index_keys.append(keys.sent_index(sender, day))
                    positions[day] = len(index_keys)
            args += (nonce, " ".join(str(positions[day]) for day in days))
        try:
            noted = await connection.script(
                connection.scripts.status_index, index_keys, args, idempotent=True
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(sender, session, sender)) from exc
        found: dict[str, list[tuple[int, str, int]]] = {}
        out = [MessageStatus(one, "unknown") for one in ids]
        for i, (one, value) in enumerate(zip(ids, noted, strict=True)):
            to, _, sent_at = str(value).partition(" ")
            if value and retention > 0 and decode_envelope_id(one)[0] >= now - retention:
                found.setdefault(to, []).append((i, one, int(sent_at)))
        replies = await asyncio.gather(
            *(self._outcomes(to, [x[1] for x in wanted], now) for to, wanted in found.items())
        )
        for (to, wanted), reply in zip(found.items(), replies, strict=True):
            for (i, one, sent_ms), (state, deliveries, reason) in zip(wanted, reply, strict=True):
                count = int(str(deliveries))
                if state != "unknown":
                    out[i] = MessageStatus(
                        one, str(state), to, count if count >= 0 else None, sent_ms, str(reason) or None
                    )
        return out

    async def _outcomes(self, to: str, ids: list[str], now: int) -> list[list[object]]:
        """``status.lua`` on ``to``'s slot; each envelope's outcome record may be in the hash of any day
        from its entry's (less the clocks' skew) to today's, and is looked for newest first."""
        keys = [self.keys.inbox(to)]
        positions: dict[int, int] = {}
        args: list[str | int] = [GROUP, now, REQUEUE_LINEAGE]
        for one in ids:
            days = range((now + SKEW_MS) // DAY_MS, (decode_envelope_id(one)[0] - SKEW_MS) // DAY_MS - 1, -1)
            for day in days:
                if day not in positions:
                    keys.append(self.keys.outcomes(to, day))
                    positions[day] = len(keys)
            args += (*entry_id(one), " ".join(str(positions[day]) for day in days))
        try:
            reply: list[list[object]] = await self.connection.script(
                self.connection.scripts.status, keys, args, idempotent=True
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(to, None, to)) from exc
        return reply

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        if not ids:
            return AckOutcome()
        connection, keys = self.connection, self.keys
        outcomes, until = outcome_hash(connection, agent, self.clock())
        args: list[str | int] = [session or "", GROUP, until]
        for one in ids:
            args += entry_id(one)
        try:
            replies = await connection.script(
                connection.scripts.ack,
                [keys.registration(agent), keys.inbox(agent), outcomes],
                args,
                idempotent=True,
                durable=True,
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session, agent)) from exc
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


def _dropped(reply: object) -> tuple[tuple[Tier, str], ...]:
    if not isinstance(reply, list):
        return ()
    return tuple((tier_of(str(reply[i])), str(reply[i + 1])) for i in range(0, len(reply) - 1, 2))
