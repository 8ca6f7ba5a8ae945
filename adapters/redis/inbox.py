"""``RedisInboxStore``: one stream per agent with a consumer group; semantics of ``IInboxStore``.

Send, fetch and acknowledge are each one Lua script call (atomic; concurrent calls share round trips
through ``RedisConnection.evalsha``'s auto-pipelining). A blocking fetch first runs the fetch script;
only when it finds nothing does it block on ``XREADGROUP ... BLOCK`` for new entries, so nothing that
arrived in between is missed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence

from redis.exceptions import ResponseError

from adapters.redis.connection import RedisConnection, RedisSettings, bulk, pack_args
from adapters.redis.keys import GROUP
from broker.envelope import Tier, format_ms, parse_ms
from broker.errors import (
    BackendUnavailable,
    InboxFull,
    RateLimited,
    RelayError,
    SessionSuperseded,
    UnknownRecipient,
    UnregisteredAgent,
)
from broker.ids import decode_envelope_id, encode_envelope_id, new_nonce
from broker.ports import AckOutcome, Appended, StoredEnvelope

_TIERS = {tier.label: tier for tier in Tier}
_MAX_ROUTES = 4096


class RedisInboxStore:
    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.keys = connection.keys
        # The send script's arguments, pre-encoded: numkeys, the four keys, the sender and its session
        # per (sender, recipient, session); the settings' four values (between the per-send values and
        # the fields); the field names. Each cache is emptied when full.
        self._routes: dict[tuple[str, str, str], bytes] = {}
        self._limits: tuple[RedisSettings, bytes] | None = None
        self._names: dict[str, bytes] = {}

    def _route(self, sender: str, to: str, session: str) -> bytes:
        keys = self.keys
        names = (keys.registration(sender), keys.registration(to), keys.inbox(to), keys.rate(sender))
        packed = pack_args((len(names), *names, sender, session))
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        self._routes[sender, to, session] = packed
        return packed

    def _name(self, name: str) -> bytes:
        """``bulk(name)`` of a field name, cached."""
        packed = self._names.get(name)
        if packed is None:
            packed = bulk(name)
            if len(self._names) >= _MAX_ROUTES:
                self._names.clear()
            self._names[name] = packed
        return packed

    def _send_limits(self) -> bytes:
        settings = self.connection.settings
        if self._limits is None or self._limits[0] is not settings:
            values = (settings.inbox_cap, GROUP, repr(float(settings.send_rate)), settings.send_burst)
            self._limits = (settings, pack_args(values))
        return self._limits[1]

    async def open(self) -> None:
        await self.connection.open()

    async def close(self) -> None:
        await self.connection.close()

    async def ping(self) -> bool:
        return await self.connection.ping()

    async def append(
        self,
        sender: str,
        to: str,
        fields: Mapping[str, str],
        *,
        sent_at_ms: int,
        sender_session: str | None = None,
    ) -> Appended:
        nonce = new_nonce()
        # = evalsha(send, [reg(sender), reg(to), inbox(to), rate(sender)], [sender, session, sent_at,
        #   nonce, cap, group, rate, burst, *fields]), encoded in parts (see docs/performance.md)
        session = sender_session or ""
        parts = [
            self._routes.get((sender, to, session)) or self._route(sender, to, session),
            bulk(format_ms(sent_at_ms)),
            bulk(nonce),
            self._send_limits(),
        ]
        for name, value in fields.items():
            parts.append(self._names.get(name) or self._name(name))
            parts.append(bulk(value))
        packed = b"".join(parts)
        count = 13 + 2 * len(fields)
        connection = self.connection

        def run() -> Awaitable[list[str]]:
            return connection.evalsha_packed(connection.scripts.send, count, packed)

        try:
            stream_id, tier = await connection.call(run, idempotent=False)
        except ResponseError as exc:
            raise _refusal(exc, sender, sender_session, to) from exc
        ms, seq = _position(stream_id)
        return Appended(encode_envelope_id(ms, seq, nonce), _TIERS[tier], sent_at_ms)

    async def fetch(
        self, agent: str, limit: int, *, wait: float | None = None, session: str | None = None
    ) -> list[StoredEnvelope]:
        keys = self.keys

        script_keys = [keys.registration(agent), keys.inbox(agent)]
        script_args: list[str | int] = [session or "", GROUP, agent, limit]
        connection = self.connection

        def run() -> Awaitable[list[list[object]]]:
            return connection.evalsha(connection.scripts.fetch, script_keys, script_args)

        try:
            rows = await connection.call(run, idempotent=True)
        except ResponseError as exc:
            raise _refusal(exc, agent, session, agent) from exc
        if rows or not wait:
            return [_stored(agent, row) for row in rows]
        return await self._block(agent, limit, wait)

    async def _block(self, agent: str, limit: int, wait: float) -> list[StoredEnvelope]:
        key = self.keys.inbox(agent)
        block_ms = max(1, int(wait * 1000))

        async def run() -> list[list[object]]:
            reply = await self.connection.blocking.xreadgroup(
                GROUP, agent, {key: ">"}, count=limit, block=block_ms
            )
            out: list[list[object]] = []
            for _stream, entries in _streams(reply):
                for entry_id, values in entries:
                    out.append([entry_id, values, 1, 1])
            return out

        try:
            rows = await self.connection.call(run, idempotent=False)
        except ResponseError as exc:
            raise BackendUnavailable(f"blocking fetch failed: {exc}") from exc
        return [_stored(agent, row) for row in rows]

    async def ack(self, agent: str, ids: Sequence[str], *, session: str | None = None) -> AckOutcome:
        if not ids:
            return AckOutcome()
        args: list[str] = [session or "", GROUP]
        for envelope_id in ids:
            ms, seq, nonce = decode_envelope_id(envelope_id)
            args.append(f"{ms}-{seq}")
            args.append(nonce)
        keys = self.keys

        script_keys = [keys.registration(agent), keys.inbox(agent)]
        connection = self.connection

        def run() -> Awaitable[list[int | list[str]]]:
            return connection.evalsha(connection.scripts.ack, script_keys, args)

        try:
            replies = await self.connection.call(run, idempotent=True)
        except ResponseError as exc:
            raise _refusal(exc, agent, session, agent) from exc
        acknowledged: list[str] = []
        origins: list[tuple[str, Tier]] = []
        unknown: list[str] = []
        for envelope_id, reply in zip(ids, replies, strict=True):
            if isinstance(reply, list):
                acknowledged.append(envelope_id)
                origins.append((str(reply[0]), Tier.from_label(str(reply[1]))))
            else:
                unknown.append(envelope_id)
        return AckOutcome(tuple(acknowledged), tuple(unknown), tuple(origins))


def _refusal(exc: ResponseError, agent: str, session: str | None, to: str) -> RelayError:
    text = str(exc)
    if text.startswith("RELAY_UNREGISTERED"):
        return UnregisteredAgent(agent)
    if text.startswith("RELAY_SUPERSEDED"):
        return SessionSuperseded(agent, session or "")
    if text.startswith("RELAY_UNKNOWN_RECIPIENT"):
        return UnknownRecipient(to)
    if text.startswith("RELAY_INBOX_FULL"):
        return InboxFull(to, int(text.split()[1]))
    if text.startswith("RELAY_RATE_LIMITED"):
        return RateLimited(agent, int(text.split()[1]) / 1000)
    return BackendUnavailable(f"the message store refused the operation: {text}; retry shortly")


def _position(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq)


def _pairs(values: object) -> dict[str, str]:
    if isinstance(values, dict):
        return {str(k): str(v) for k, v in values.items()}
    if isinstance(values, list):
        return {str(values[i]): str(values[i + 1]) for i in range(0, len(values) - 1, 2)}
    return {}


def _streams(reply: object) -> list[tuple[str, list[tuple[str, object]]]]:
    # redis-py answers XREADGROUP as a list of [stream, entries] (RESP2) or a dict (RESP3)
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(str(k), list(v[0] if v and isinstance(v[0], list) else v)) for k, v in reply.items()]
    if not isinstance(reply, list):
        return []
    return [(str(stream), list(entries)) for stream, entries in reply]


def _stored(agent: str, row: Sequence[object]) -> StoredEnvelope:
    entry_id, values, deliveries, first = row
    if type(values) is list:
        # a flat [name, value, ...] list of strings (the connections decode replies): = _pairs(values)
        pairs = iter(values)
        fields = dict(zip(pairs, pairs, strict=False))
    else:
        fields = _pairs(values)
    ms, seq = _position(str(entry_id))
    sender = fields.pop("from", "")
    tier = fields.pop("tier", "")
    sent_at = fields.pop("sent_at", "")
    nonce = fields.pop("nonce", "")
    fields.pop("requeued_from", None)  # set on dead letters brought back; not part of the body
    return StoredEnvelope(
        envelope_id=encode_envelope_id(ms, seq, nonce),
        sender=sender,
        to=agent,
        tier=_TIERS.get(tier) or Tier.from_label(tier),
        sent_at_ms=parse_ms(sent_at),
        fields=fields,
        deliveries=int(str(deliveries)),
        first_delivery=bool(int(str(first))),
    )
