"""``RedisDeliveryQueue``: claim-based delivery on the inbox streams; semantics of ``IDeliveryQueue``.

Each receive loop is a consumer ``<agent>@<loop-id>`` in the inbox's group ``relay``, so ``>`` hands a
new entry to exactly one loop and the PEL records who holds what and since when (idle time, on the
server's clock) and how often it was delivered. Claim, retry/touch, dead-letter and requeue are each
one Lua script (``lua/claim.lua``, ``retry.lua``, ``dead_letter.lua``, ``requeue.lua``); see
docs/delivery.md. Dead letters live in ``keys.dead_letters(agent)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import dead_letter, entry_id, envelope_id, rows
from adapters.redis.errors import Refused, refusal, store_error
from adapters.redis.inbox import RedisInboxStore, outcome_hash
from adapters.redis.keys import GROUP
from adapters.redis.protocol_delivery import (
    Requeued,
    claim_call,
    dead_letter_call,
    read_counts,
    requeue_call,
    retry_call,
)
from adapters.redis.protocol_inbox import HistoryRule
from broker.delivery import DeadLetter
from broker.envelope import now_ms
from broker.ids import is_envelope_id, new_nonce
from broker.limits import REQUEUE_LINEAGE
from broker.ports import AckOutcome, StoredEnvelope

log = logging.getLogger("relay.delivery")

_MAX_REQUEUE = 1000
"""Dead letters one requeue script call moves; ``requeue`` of all repeats calls until none is left."""


class RedisDeliveryQueue:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys
        self.scripts = connection.scripts
        # acknowledging is the inbox store's own script (nonce check, XACK + XDEL)
        self._inbox = RedisInboxStore(connection)
        self._handing_back: set[asyncio.Future[list[int]]] = set()

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def claim(
        self,
        agent: str,
        consumer: str,
        limit: int,
        *,
        visibility: float,
        wait: float | None = None,
    ) -> list[StoredEnvelope]:
        found = await self._claim(agent, consumer, limit, visibility)
        if found or not wait or wait <= 0:
            return found
        deadline = time.monotonic() + wait  # the messenger's claim_wait
        with self.connection.wakeups.park(agent) as parked:
            while True:
                parked.rearm()
                found = await self._claim(agent, consumer, limit, visibility)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0 or not await parked.wait(remaining):
                    return found

    async def _claim(self, agent: str, consumer: str, limit: int, visibility: float) -> list[StoredEnvelope]:
        claim = claim_call(self.keys, agent, consumer, limit, visibility_ms=max(1, int(visibility * 1000)))
        # not idempotent: a lost reply would leave claimed entries with this consumer; they come
        # back after the visibility timeout, but a blind retry would skip them until then
        call = asyncio.ensure_future(
            self.connection.script(self.scripts.claim, claim.keys, claim.args, idempotent=False)
        )
        try:
            reply = await asyncio.shield(call)
        except asyncio.CancelledError:
            # the caller stopped (a receive loop ending) while the script was on its way: it still runs
            # and may claim envelopes nobody will handle, so they are handed back as soon as it answers
            call.add_done_callback(lambda done: self._hand_back(agent, consumer, done))
            raise
        except ResponseError as exc:
            raise refusal(exc, Refused(agent)) from exc
        return rows(agent, reply)

    def _hand_back(self, agent: str, consumer: str, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        claimed = [row.envelope_id for row in rows(agent, done.result())]
        if claimed:
            task = asyncio.ensure_future(self._reclaim(agent, consumer, "release", claimed))
            self._handing_back.add(task)
            task.add_done_callback(self._handed_back)

    def _handed_back(self, task: asyncio.Future[list[int]]) -> None:
        self._handing_back.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not hand back envelopes of a stopped claim: %s", task.exception())

    async def _reclaim(self, agent: str, consumer: str, mode: str, ids: Sequence[str]) -> list[int]:
        valid = [i for i in ids if is_envelope_id(i)]
        if not valid:
            return [0] * len(ids)
        call = retry_call(self.keys, agent, consumer, mode, [entry_id(one) for one in valid])
        try:
            replies = read_counts(
                await self.connection.script(
                    self.scripts.retry, call.keys, call.args, idempotent=mode != "retry"
                )
            )
        except ResponseError as exc:
            raise store_error(exc) from exc
        counts = dict(zip(valid, replies, strict=True))
        return [counts.get(i, 0) for i in ids]

    async def retry(self, agent: str, consumer: str, envelope_id: str) -> int:
        (count,) = await self._reclaim(agent, consumer, "retry", [envelope_id])
        return count

    async def touch(self, agent: str, consumer: str, ids: Sequence[str]) -> list[str]:
        if not ids:
            return []
        counts = await self._reclaim(agent, consumer, "touch", ids)
        return [i for i, n in zip(ids, counts, strict=True) if n]

    async def ack(self, agent: str, ids: Sequence[str]) -> AckOutcome:
        return await self._inbox.ack(agent, ids)

    async def dead_letter(
        self, agent: str, envelope_id: str, reason: str, *, consumer: str | None = None
    ) -> bool:
        if not is_envelope_id(envelope_id):
            return False
        now = now_ms()
        outcomes, until = outcome_hash(self.connection, agent, now)
        call = dead_letter_call(
            self.keys,
            agent,
            entry_id(envelope_id),
            consumer=consumer,
            reason=reason,
            now=now,
            outcomes=outcomes,
            until=until,
            keep=HistoryRule.of(self.connection.settings),
        )
        try:
            # not retried: after a lost reply the entry is gone, and a retry would report False
            moved = await self.connection.script(
                self.scripts.dead_letter, call.keys, call.args, idempotent=False, durable=True
            )
        except ResponseError as exc:
            raise store_error(exc) from exc
        return bool(int(moved))

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]:
        key = self.keys.dead_letters(agent)

        async def run(client: Redis | RedisCluster) -> list[DeadLetter]:
            reply = await client.xrange(key, "-", "+", count=max(1, limit))
            return [dead_letter(agent, values) for _, values in reply or []]

        return await self.connection.call(run, idempotent=True)

    async def dead_letter_count(self, agent: str) -> int:
        key = self.keys.dead_letters(agent)

        async def run(client: Redis | RedisCluster) -> int:
            return int(await client.xlen(key))

        return await self.connection.call(run, idempotent=True)

    async def requeue(self, agent: str, ids: Sequence[str] | None = None) -> list[str]:
        if ids is not None:
            wanted = list(dict.fromkeys(i for i in ids if is_envelope_id(i)))
            return await self._requeue_call(agent, wanted, len(wanted)) if wanted else []
        out: list[str] = []
        # bounded: each call moves up to _MAX_REQUEUE, and requeued entries go to the inbox, not back
        for _ in range(1_000_000 // _MAX_REQUEUE):
            moved = await self._requeue_call(agent, [], _MAX_REQUEUE)
            out += moved
            if len(moved) < _MAX_REQUEUE:
                break
        return out

    async def _requeue_call(self, agent: str, wanted: Sequence[str], count: int) -> list[str]:
        outcomes, until = outcome_hash(self.connection, agent, now_ms())
        nonces = [new_nonce() for _ in range(count)]
        call = requeue_call(
            self.keys, agent, wanted, nonces, lineage=REQUEUE_LINEAGE, outcomes=outcomes, until=until
        )
        try:
            flat = await self.connection.script(
                self.scripts.requeue, call.keys, call.args, idempotent=False, durable=True
            )
        except ResponseError as exc:
            raise store_error(exc) from exc
        return [envelope_id(one.stream_id, one.nonce) for one in Requeued.read_all(flat)]

    async def release(self, agent: str, consumer: str, ids: Sequence[str] = ()) -> None:
        if ids:
            await self._reclaim(agent, consumer, "release", ids)
        key = self.keys.inbox(agent)

        async def run(client: Redis | RedisCluster) -> None:
            try:
                found = await client.xinfo_consumers(key, GROUP)
            except ResponseError:
                return  # no stream or group: nothing to forget
            for row in found:
                # only the loop itself claims to its own name, and it has ended, so nothing can be
                # added between this check and the delete
                if str(row.get("name")) == consumer and int(row.get("pending", 0)) == 0:
                    await client.xgroup_delconsumer(key, GROUP, consumer)

        await self.connection.call(run, idempotent=True)
