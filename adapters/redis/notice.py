"""``RedisNoticeStore``: mail-pending notices on Redis; semantics of ``INoticeStore``.

The cursor lives in Redis (``Keys.notice``), so every worker shares it; one script, ``lua/notice.lua``
on the agent's slot, checks the session and announces atomically. A wait that finds nothing parks on
the worker's wake-ups (``adapters/redis/wake.py``: one subscriber connection per worker, whatever the
number of waiters) and runs the script again when woken, or when a reminder falls due.
"""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import announced
from adapters.redis.errors import Refused, refusal
from adapters.redis.protocol_inbox import Announcement, notice_call
from broker.ports import NOTICE_MAX_COUNT, Notice

MAX_CONCURRENT_LOOKS = 4
"""Notice scripts one worker runs at once: a storm of waiters (thousands
connecting, or all of them looking again after the subscription came back) queues here instead of
opening the pool's every connection; each look takes Redis a few microseconds."""


class RedisNoticeStore:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.backend = connection
        """``Relay`` opens and closes it (once for all the stores on it)."""
        self.keys = connection.keys
        self._looks = asyncio.Semaphore(MAX_CONCURRENT_LOOKS)

    async def wait(
        self, agent: str, session: str, *, seconds: float, remind_after: float, listed: int, seen: bool = True
    ) -> Notice:
        notice, due = await self._announce(agent, session, remind_after, listed, seen)
        if notice.count or seconds <= 0:
            return notice
        wakeups = self.connection.wakeups
        deadline = time.monotonic() + seconds
        with wakeups.park(agent) as parked:
            while not wakeups.closed:
                parked.rearm()  # before looking: a wake-up after the look is not missed
                notice, due = await self._announce(agent, session, remind_after, listed, seen)
                left = deadline - time.monotonic()
                if notice.count or left <= 0:
                    return notice
                await parked.wait(left if due is None else min(left, due))
        return Notice(unacknowledged=notice.unacknowledged)

    async def _announce(
        self, agent: str, session: str, remind_after: float, listed: int, seen: bool
    ) -> tuple[Notice, float | None]:
        """The notice due now, and the seconds until a reminder falls due (None: none pending)."""
        connection = self.connection
        remind_after_ms = round(remind_after * 1000)
        call = notice_call(
            self.keys, agent, session, remind=remind_after_ms, listed=listed, most=NOTICE_MAX_COUNT, seen=seen
        )
        try:
            async with self._looks:
                # not retried: a lost reply may have moved the cursor; the reminder repeats the news
                reply = Announcement.read(
                    await connection.script(connection.scripts.notice, call.keys, call.args, idempotent=False)
                )
        except ResponseError as exc:
            raise refusal(exc, Refused(agent, session)) from exc
        notice = Notice(
            count=reply.count,
            unacknowledged=reply.unacknowledged,
            reminder=reply.reminder,
            envelopes=tuple(announced(row) for row in reply.rows),
        )
        return notice, (reply.due_ms / 1000 if reply.due_ms is not None else None)
