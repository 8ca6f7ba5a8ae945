"""``RedisInboxStore``: one stream per agent with a consumer group; semantics of ``IInboxStore``.

Every script call touches one agent's keys (one hash slot), so the store runs on one Redis or a
cluster alike (docs/redis-layout.md):

- send: ``send_check`` on the sender's slot (registration, session, idempotency claim, rate token,
  status index; returns its tier and provider), then ``send_append`` on the recipient's slot
  (idempotency record, registration, contact policy, cap, ``XADD``, wake-up). When step 2 refuses,
  ``send_refund`` undoes step 1, so a refused send leaves nothing behind.
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

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import entry_id, envelope_id, rows, tier_of
from adapters.redis.errors import Refused, refusal
from adapters.redis.protocol import (
    DAY_MS,
    SendAppended,
    SendCall,
    SendChecked,
    send_call,
    with_tier,
)
from adapters.redis.protocol_inbox import (
    Dropped,
    Fetch,
    HistoryRule,
    Outcome,
    ack_call,
    fetch_call,
    purge_call,
    read_acked,
    read_noted,
    read_purged,
    read_swept,
    status_call,
    status_index_call,
    sweep_call,
)
from broker.envelope import Tier, now_ms
from broker.errors import RelayError
from broker.ids import decode_envelope_id, new_nonce
from broker.limits import PURGE_BATCH, REQUEUE_LINEAGE
from broker.ports import AckOutcome, Appended, Fetched, MessageStatus, SendOptions

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
        self.backend = connection
        """``Relay`` opens and closes it (once for all the stores on it)."""
        self.keys = connection.keys
        self.clock = clock
        self._keep = HistoryRule.of(connection.settings)

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
            replies_until=self._replies_until,
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

    def _replies_until(self, day: int) -> int:
        """When the replies index of ``day`` expires: with the history (a day at least, for threads of
        mail still in inboxes when no history is kept)."""
        return retained_until(day, max(self.connection.settings.history_retention_ms, DAY_MS))

    async def _two_steps(self, call: SendCall) -> SendAppended:
        """A send on a cluster: step 1 on the sender's slot, step 2 on the recipient's, and the undo
        (or the status note) on the sender's slot again (see docs/redis-layout.md). ``send.lua`` decides
        the undo and the note in Lua for one Redis; tests/test_script_protocol.py runs one story through
        both and compares what they answer and leave."""
        connection, scripts = self.connection, self.connection.scripts
        check = call.check
        checked = SendChecked.read(
            await connection.script(scripts.send_check, check.keys, check.args, idempotent=False)
        )
        append = with_tier(call.append, checked.tier, checked.provider)
        try:
            reply = SendAppended.read(
                await connection.script(
                    scripts.send_append, append.keys, append.args, idempotent=False, durable=True
                )
            )
        except ResponseError:
            with contextlib.suppress(RelayError):  # not undone: one token less, never one more
                refund = call.refund(checked.refund_burst)
                await connection.script(scripts.send_refund, refund.keys, refund.args, idempotent=False)
            raise
        note = call.note() if checked.repeat and not reply.repeat else None
        if note is not None:
            # the first attempt claimed the key but never landed: this one did, so note it for status
            await connection.script(scripts.send_note, note.keys, note.args, idempotent=True)
        return reply

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> Fetched:
        found = await self._fetch(agent, limit, session)
        if found.envelopes or not wait or wait <= 0:
            return found
        deadline = time.monotonic() + wait  # the relay capped it (max_wait)
        with self.connection.wakeups.park(agent) as parked:
            while True:
                parked.rearm()
                more = await self._fetch(agent, limit, session)
                found = Fetched(more.envelopes, found.dead_lettered + more.dead_lettered)
                remaining = deadline - time.monotonic()
                if found.envelopes or remaining <= 0 or not await parked.wait(remaining):
                    return found

    async def _fetch(self, agent: str, limit: int, session: str | None) -> Fetched:
        connection = self.connection
        now = self.clock()
        outcomes, until = outcome_hash(connection, agent, now)
        call = fetch_call(
            self.keys,
            agent,
            session,
            limit,
            now=now,
            max_deliveries=connection.settings.max_deliveries,
            outcomes=outcomes,
            until=until,
            keep=self._keep,
        )
        try:
            reply = Fetch.read(
                await connection.script(connection.scripts.fetch, call.keys, call.args, idempotent=True)
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session)) from exc
        return Fetched(rows(agent, reply.rows), _tiers(reply.dropped))

    async def sweep(self, agent: str, limit: int) -> list[tuple[Tier, str]]:
        connection = self.connection
        now = self.clock()
        outcomes, until = outcome_hash(connection, agent, now)
        call = sweep_call(
            self.keys,
            agent,
            now=now,
            outcomes=outcomes,
            until=until,
            limit=limit,
            keep=self._keep,
        )
        try:
            dropped = await connection.script(connection.scripts.sweep, call.keys, call.args, idempotent=True)
        except ResponseError as exc:
            raise refusal(exc, Refused(agent)) from exc
        return list(_tiers(read_swept(dropped)))

    async def purge(self, agent: str) -> int:
        return await purge_inbox(self.connection, agent, "+", self.clock)

    async def status(
        self, sender: str, ids: Sequence[str], *, session: str | None = None
    ) -> list[MessageStatus]:
        connection = self.connection
        retention = connection.settings.status_retention_ms
        now = self.clock()
        lookups = []
        for one in ids:
            ms, _, nonce = decode_envelope_id(one)
            lookups.append((nonce, sorted({(ms - SKEW_MS) // DAY_MS, (ms + SKEW_MS) // DAY_MS})))
        call = status_index_call(self.keys, sender, session, lookups)
        try:
            noted = read_noted(
                await connection.script(
                    connection.scripts.status_index, call.keys, call.args, idempotent=True
                )
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(sender, session)) from exc
        found: dict[str, list[tuple[int, str, int]]] = {}
        out = [MessageStatus(one, "unknown") for one in ids]
        for i, (one, value) in enumerate(zip(ids, noted, strict=True)):
            if value is not None and retention > 0 and decode_envelope_id(one)[0] >= now - retention:
                found.setdefault(value[0], []).append((i, one, value[1]))
        replies = await asyncio.gather(
            *(self._outcomes(to, [x[1] for x in wanted], now) for to, wanted in found.items())
        )
        for (to, wanted), reply in zip(found.items(), replies, strict=True):
            for (i, one, sent_ms), outcome in zip(wanted, reply, strict=True):
                if outcome.state != "unknown":
                    out[i] = MessageStatus(
                        one, outcome.state, to, outcome.deliveries, sent_ms, outcome.reason
                    )
        return out

    async def _outcomes(self, to: str, ids: list[str], now: int) -> list[Outcome]:
        """``status.lua`` on ``to``'s slot; each envelope's outcome record may be in the hash of any day
        from its entry's (less the clocks' skew) to today's, and is looked for newest first."""
        newest = (now + SKEW_MS) // DAY_MS
        lookups = [
            (entry_id(one), range(newest, (decode_envelope_id(one)[0] - SKEW_MS) // DAY_MS - 1, -1))
            for one in ids
        ]
        call = status_call(self.keys, to, now=now, hops=REQUEUE_LINEAGE, lookups=lookups)
        try:
            reply = await self.connection.script(
                self.connection.scripts.status, call.keys, call.args, idempotent=True
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(to)) from exc
        return Outcome.read_all(reply)

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        if not ids:
            return AckOutcome()
        connection = self.connection
        outcomes, until = outcome_hash(connection, agent, self.clock())
        entries = [entry_id(one) for one in ids]
        call = ack_call(
            self.keys,
            agent,
            session,
            entries,
            outcomes=outcomes,
            until=until,
            keep=self._keep,
        )
        try:
            replies = read_acked(
                await connection.script(
                    connection.scripts.ack, call.keys, call.args, idempotent=True, durable=True
                )
            )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session)) from exc
        acknowledged: list[str] = []
        origins: list[tuple[str, Tier]] = []
        unknown: list[str] = []
        for one, reply in zip(ids, replies, strict=True):
            if reply is not None:
                acknowledged.append(one)
                origins.append((reply[0], tier_of(reply[1])))
            else:
                unknown.append(one)
        return AckOutcome(tuple(acknowledged), tuple(unknown), tuple(origins))


async def purge_inbox(
    connection: RedisConnection, agent: str, upto: str, clock: Callable[[], int] = now_ms
) -> int:
    """Drop ``agent``'s inbox entries up to the entry id ``upto`` (``+``: its newest now),
    ``PURGE_BATCH`` per ``purge.lua`` call, each recorded ``purged``; how many. What is sent meanwhile
    comes after ``upto`` and stays, so the calls end once what was there is gone."""
    if upto == "+":
        upto = await _newest(connection, agent)
    dropped = 0
    for _ in range(PURGE_MAX_CALLS if upto else 0):
        outcomes, until = outcome_hash(connection, agent, clock())
        call = purge_call(
            connection.keys, agent, upto=upto, batch=PURGE_BATCH, outcomes=outcomes, until=until
        )
        reply = await connection.script(connection.scripts.purge, call.keys, call.args, idempotent=True)
        n, more = read_purged(reply)
        dropped += n
        if not more:
            break
    return dropped


PURGE_MAX_CALLS: Final = 1_000_000
"""Purge calls one purge makes at most (a billion envelopes): the loop is bounded whatever happens."""


async def _newest(connection: RedisConnection, agent: str) -> str:
    """The id of the newest entry of ``agent``'s inbox, '' when it is empty."""
    key = connection.keys.inbox(agent)

    async def run(client: Redis | RedisCluster) -> str:
        top = await client.xrevrange(key, "+", "-", count=1)
        return str(top[0][0]) if top else ""

    return await connection.call(run, idempotent=True)


def _tiers(dropped: Dropped) -> tuple[tuple[Tier, str], ...]:
    return tuple((tier_of(tier), reason) for tier, reason in dropped)
