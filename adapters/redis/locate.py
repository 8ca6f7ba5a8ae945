"""Where an envelope is now: ``relay show ENVELOPE_ID``.

An envelope id holds its stream entry id (milliseconds and sequence) and its nonce, but not its
recipient: each agent's inbox and dead-letter stream is asked in turn (``lua/locate.lua``, one
read-only call per agent on the agent's slot, auto-pipelined, so it runs on one Redis and a cluster
alike). Acknowledging deletes an envelope, so an acknowledged one is found nowhere.

``state_of`` is the one place a location becomes a state; extend it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.redis.connection import RedisConnection
from adapters.redis.directory import Directory
from adapters.redis.entries import entry_id
from adapters.redis.protocol_operator import Place, locate_call

DEAD_LETTERS_SEARCHED = 100_000
"""Dead letters of one agent looked through at most (those added since the envelope was sent)."""
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Located:
    """One envelope as Redis has it now."""

    envelope_id: str
    entry_id: str
    """The stream entry id the envelope id encodes."""
    recipient: str | None
    where: str
    """``inbox``, ``dead`` or ``nowhere``."""
    stream_key: str | None
    stream_entry: str | None
    """The entry id in ``stream_key`` (in the dead-letter stream it differs from ``entry_id``)."""
    sender: str | None = None
    tier: str | None = None
    sent_at: str | None = None
    deliveries: int = 0
    consumer: str | None = None
    idle_ms: int | None = None
    reason: str | None = None
    dead_at: str | None = None

    @property
    def state(self) -> str:
        return state_of(self)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.envelope_id,
            "state": self.state,
            "from": self.sender,
            "to": self.recipient,
            "tier": self.tier,
            "sent_at": self.sent_at,
            "deliveries": self.deliveries,
            "stream_key": self.stream_key,
            "stream_entry": self.stream_entry,
            "entry_id": self.entry_id,
            "consumer": self.consumer,
            "idle_ms": self.idle_ms,
            "reason": self.reason,
            "dead_at": self.dead_at,
        }


def state_of(found: Located) -> str:
    """``queued`` (in the inbox, never handed out), ``delivered`` (handed out, not acknowledged),
    ``expired`` (moved to the dead letters by its ``ttl_ms``), ``dead_lettered`` (for another reason),
    or ``not_found`` (acknowledged, since that deletes it, or never stored); the names are
    ``GetMessageStatus``'s (``broker.ports.STATES``)."""
    if found.where == "inbox":
        return "delivered" if found.deliveries > 0 else "queued"
    if found.where == "dead":
        return "expired" if found.reason == "expired" else "dead_lettered"
    return "not_found"


async def locate(
    connection: RedisConnection, envelope_id: str, agents: Sequence[str] | None = None
) -> Located:
    """Find a checked ``envelope_id`` in ``agents``' streams (default: every registered agent's)."""
    if agents is None:
        agents = await Directory(connection).agents()
    stream_id, nonce = entry_id(envelope_id)
    keys, script = connection.keys, connection.scripts.locate
    for start in range(0, len(agents), _CHUNK):
        chunk = agents[start : start + _CHUNK]
        replies = await asyncio.gather(
            *(
                connection.script(script, call.keys, call.args, idempotent=True)
                for call in (
                    locate_call(keys, a, (stream_id, nonce), envelope_id, most=DEAD_LETTERS_SEARCHED)
                    for a in chunk
                )
            )
        )
        for agent, reply in zip(chunk, replies, strict=True):
            place = Place.read(reply)
            if place is not None:
                return _located(connection, envelope_id, stream_id, agent, place)
    return Located(envelope_id, stream_id, None, "nowhere", None, None)


def _located(connection: RedisConnection, envelope_id: str, stream_id: str, agent: str, p: Place) -> Located:
    if p.where == "inbox":
        return Located(
            envelope_id, stream_id, agent, "inbox", connection.keys.inbox(agent), stream_id,
            p.sender, p.tier, p.sent_at, deliveries=p.count, consumer=p.holder or None,
            idle_ms=p.idle_ms if p.idle_ms >= 0 else None,
        )  # fmt: skip
    return Located(
        envelope_id, stream_id, agent, "dead", connection.keys.dead_letters(agent), p.dead_entry,
        p.sender, p.tier, p.sent_at, deliveries=p.count, reason=p.reason, dead_at=p.dead_at,
    )  # fmt: skip
