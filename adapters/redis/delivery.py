"""``RedisDeliveryQueue``: claim-based delivery on the inbox streams; semantics of ``IDeliveryQueue``.

Each receive loop is a consumer ``<agent>@<loop-id>`` in the inbox's group ``relay``, so ``>`` hands a
new entry to exactly one loop and the PEL records who holds what and since when (idle time, on the
server's clock) and how often it was delivered. Claim, retry/touch, dead-letter and requeue are each
one Lua script (``lua/claim.lua``, ``retry.lua``, ``dead_letter.lua``, ``requeue.lua``); see
docs/delivery.md. Dead letters live in ``keys.dead_letters(agent)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection
from adapters.redis.inbox import RedisInboxStore
from adapters.redis.keys import GROUP
from adapters.redis.scripts import read_script
from broker.delivery import DEAD_LETTER_FIELDS, REQUEUED_FROM, DeadLetter
from broker.envelope import Tier, format_time, from_ms, now_ms, parse_time, to_ms
from broker.errors import BackendUnavailable, UnregisteredAgent
from broker.ids import decode_envelope_id, encode_envelope_id, is_envelope_id, new_nonce
from broker.ports import AckOutcome, StoredEnvelope

_HEADER = ("from", "tier", "sent_at", "nonce")
_MAX_REQUEUE = 1000
"""Dead letters one requeue script call moves; ``requeue`` of all repeats calls until none is left."""


class RedisDeliveryQueue:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys
        client = connection.client
        self._claim: AsyncScript = client.register_script(read_script("claim"))
        self._retry: AsyncScript = client.register_script(read_script("retry"))
        self._dead_letter: AsyncScript = client.register_script(read_script("dead_letter"))
        self._requeue: AsyncScript = client.register_script(read_script("requeue"))
        # acknowledging is the inbox store's own script (nonce check, XACK + XDEL)
        self._inbox = RedisInboxStore(connection)

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
        keys = self.keys
        min_idle_ms = max(1, int(visibility * 1000))

        async def run() -> list[list[object]]:
            reply: list[list[object]] = await self._claim(
                keys=[keys.registration(agent), keys.inbox(agent)],
                args=[GROUP, consumer, limit, min_idle_ms],
            )
            return reply

        try:
            # not idempotent: a lost reply would leave claimed entries with this consumer; they come
            # back after the visibility timeout, but a blind retry would skip them until then
            rows = await self.connection.call(run, idempotent=False)
        except ResponseError as exc:
            if str(exc).startswith("RELAY_UNREGISTERED"):
                raise UnregisteredAgent(agent) from exc
            raise BackendUnavailable(f"claim failed: {exc}; retry shortly") from exc
        if rows or not wait:
            return [_stored(agent, row) for row in rows]
        return await self._block(agent, consumer, limit, min(wait, self.connection.settings.max_block))

    async def _block(self, agent: str, consumer: str, limit: int, wait: float) -> list[StoredEnvelope]:
        key = self.keys.inbox(agent)

        async def run() -> list[list[object]]:
            reply = await self.connection.blocking.xreadgroup(
                GROUP, consumer, {key: ">"}, count=limit, block=max(1, int(wait * 1000))
            )
            return [[entry_id, values, 1, 1] for entry_id, values in _entries(reply)]

        try:
            rows = await self.connection.call(run, idempotent=False)
        except ResponseError as exc:
            raise BackendUnavailable(f"blocking claim failed: {exc}") from exc
        return [_stored(agent, row) for row in rows]

    async def _reclaim(self, agent: str, consumer: str, mode: str, ids: Sequence[str]) -> list[int]:
        valid = [i for i in ids if is_envelope_id(i)]
        if not valid:
            return [0] * len(ids)
        args: list[str] = [GROUP, consumer, mode]
        for envelope_id in valid:
            ms, seq, nonce = decode_envelope_id(envelope_id)
            args += [f"{ms}-{seq}", nonce]
        key = self.keys.inbox(agent)

        async def run() -> list[int]:
            reply: list[int] = await self._retry(keys=[key], args=args)
            return reply

        try:
            replies = await self.connection.call(run, idempotent=mode != "retry")
            counts = dict(zip(valid, replies, strict=True))
        except ResponseError as exc:
            raise BackendUnavailable(f"re-claim failed: {exc}; retry shortly") from exc
        return [int(counts.get(i, 0)) for i in ids]

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
        ms, seq, nonce = decode_envelope_id(envelope_id)
        keys = self.keys
        dead_at = format_time(from_ms(now_ms()))
        args = [GROUP, f"{ms}-{seq}", nonce, envelope_id, consumer or "", reason, dead_at]

        async def run() -> int:
            reply: int = await self._dead_letter(
                keys=[keys.inbox(agent), keys.dead_letters(agent)], args=args
            )
            return reply

        try:
            # not retried: after a lost reply the entry is gone, and a retry would report False
            return bool(int(await self.connection.call(run, idempotent=False)))
        except ResponseError as exc:
            raise BackendUnavailable(f"dead-lettering failed: {exc}; retry shortly") from exc

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]:
        key = self.keys.dead_letters(agent)

        async def run() -> list[tuple[str, object]]:
            reply = await self.connection.client.xrange(key, "-", "+", count=max(1, limit))
            return [(str(entry_id), values) for entry_id, values in reply or []]

        return [_dead_letter(agent, values) for _, values in await self.connection.call(run, idempotent=True)]

    async def dead_letter_count(self, agent: str) -> int:
        key = self.keys.dead_letters(agent)

        async def run() -> int:
            return int(await self.connection.client.xlen(key))

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
        keys = self.keys
        args: list[str | int] = [GROUP, len(wanted), *wanted, *(new_nonce() for _ in range(count))]

        async def run() -> list[str]:
            reply: list[str] = await self._requeue(
                keys=[keys.dead_letters(agent), keys.inbox(agent)], args=args
            )
            return reply

        try:
            flat = await self.connection.call(run, idempotent=False)
        except ResponseError as exc:
            raise BackendUnavailable(f"requeue failed: {exc}; retry shortly") from exc
        new_ids: list[str] = []
        for i in range(0, len(flat) - 2, 3):
            ms, _, seq = str(flat[i + 1]).partition("-")
            new_ids.append(encode_envelope_id(int(ms), int(seq), str(flat[i + 2])))
        return new_ids

    async def release(self, agent: str, consumer: str, ids: Sequence[str] = ()) -> None:
        if ids:
            await self._reclaim(agent, consumer, "release", ids)
        key = self.keys.inbox(agent)

        async def run() -> None:
            for row in await self.connection.client.xinfo_consumers(key, GROUP):
                # only the loop itself claims to its own name, and it has ended, so nothing can be
                # added between this check and the delete
                if str(row.get("name")) == consumer and int(row.get("pending", 0)) == 0:
                    await self.connection.client.xgroup_delconsumer(key, GROUP, consumer)

        try:
            await self.connection.call(run, idempotent=True)
        except ResponseError:
            return  # no stream or group: nothing to forget


def _pairs(values: object) -> dict[str, str]:
    if isinstance(values, dict):
        return {str(k): str(v) for k, v in values.items()}
    if isinstance(values, list):
        return {str(values[i]): str(values[i + 1]) for i in range(0, len(values) - 1, 2)}
    return {}


def _entries(reply: object) -> list[tuple[str, object]]:
    # redis-py answers XREADGROUP as a list of [stream, entries] (RESP2) or a dict (RESP3)
    streams: list[object] = []
    if isinstance(reply, dict):
        streams = [v[0] if v and isinstance(v[0], list) else v for v in reply.values()]
    elif isinstance(reply, list):
        streams = [pair[1] for pair in reply]
    out: list[tuple[str, object]] = []
    for entries in streams:
        if isinstance(entries, list):
            out += [(str(entry_id), values) for entry_id, values in entries]
    return out


def _stored(agent: str, row: Sequence[object]) -> StoredEnvelope:
    entry_id, values, deliveries, first = row
    fields = _pairs(values)
    ms, _, seq = str(entry_id).partition("-")
    header = {k: fields.pop(k, "") for k in _HEADER}
    fields.pop(REQUEUED_FROM, None)
    return StoredEnvelope(
        envelope_id=encode_envelope_id(int(ms), int(seq), header["nonce"]),
        sender=header["from"],
        to=agent,
        tier=Tier.from_label(header["tier"]),
        sent_at_ms=to_ms(parse_time(header["sent_at"])),
        fields=fields,
        deliveries=int(str(deliveries)),
        first_delivery=bool(int(str(first))),
    )


def _dead_letter(agent: str, values: object) -> DeadLetter:
    fields = _pairs(values)
    meta = {k: fields.pop(k, "") for k in DEAD_LETTER_FIELDS}
    header = {k: fields.pop(k, "") for k in ("from", "tier", "sent_at")}
    requeued_from = fields.pop(REQUEUED_FROM, None)
    return DeadLetter(
        envelope_id=meta["envelope_id"],
        sender=header["from"],
        to=agent,
        tier=Tier.from_label(header["tier"] or "network"),
        sent_at_ms=to_ms(parse_time(header["sent_at"])),
        fields=fields,
        attempts=int(meta["attempts"] or 0),
        reason=meta["reason"],
        dead_at_ms=to_ms(parse_time(meta["dead_at"])),
        requeued_from=requeued_from,
    )
