"""The calling convention of the registration, webhook and operator scripts (``lua/register.lua``,
``webhook_secret.lua``, ``webhook_release.lua``, ``inspect.lua``, ``locate.lua``, ``peek.lua``,
``thread_read.lua``): the
one place their KEYS and ARGV are built, in the order each script names them at its top, and their
replies read (``adapters/redis/protocol.py`` does the same for a send)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapters.redis.entries import archived, stored
from adapters.redis.keys import GROUP, Keys
from adapters.redis.protocol import DAY_MS, Arg, Call
from broker.addresses import Address
from broker.envelope import format_ms
from broker.ids import decode_envelope_id
from broker.ports import SUPERSEDED_SESSIONS_KEPT, StoredEnvelope


def register_call(keys: Keys, agent: str, address: Address, session: str, *, now: int) -> Call:
    """``now``: ms since the epoch; the registration stores it as ISO-8601 text."""
    return Call(
        [keys.registration(agent), keys.inbox(agent), keys.retired(agent)],
        [
            agent,
            address.provider,
            address.endpoint,
            address.tier.label,
            session,
            format_ms(now),
            GROUP,
            keys.wake_channel(),
            SUPERSEDED_SESSIONS_KEPT,
        ],
    )


@dataclass(frozen=True, slots=True)
class Registered:
    """``register.lua``'s reply: the session registered before ('' when none), the stored
    registered_at text, and whether the registration is new."""

    previous: str
    registered_at: str
    created: bool

    @classmethod
    def read(cls, reply: Sequence[object]) -> Registered:
        previous, registered_at, created = reply
        return cls(str(previous or ""), str(registered_at), bool(int(str(created))))


def webhook_secret_call(keys: Keys, agent: str, session: str, endpoint: str, secret: str) -> Call:
    return Call([keys.registration(agent)], [session, endpoint, secret])


def webhook_release_call(keys: Keys, agent: str, holder: str, answered: str | None) -> Call:
    return Call([keys.webhook_claim(agent), keys.registration(agent)], [holder, answered or ""])


def inspect_call(keys: Keys, agent: str) -> Call:
    return Call(
        [keys.registration(agent), keys.inbox(agent), keys.dead_letters(agent), keys.delivery_counts(agent)],
        [GROUP],
    )


def locate_call(keys: Keys, agent: str, entry: tuple[str, str], envelope_id: str, *, most: int) -> Call:
    """``entry``: the (stream entry id, nonce) ``envelope_id`` encodes; ``most``: dead letters to
    look through at most."""
    stream_id, nonce = entry
    return Call([keys.inbox(agent), keys.dead_letters(agent)], [GROUP, stream_id, nonce, envelope_id, most])


@dataclass(frozen=True, slots=True)
class Place:
    """``locate.lua``'s reply when it found the envelope. In the inbox: ``count`` is its deliveries,
    ``holder`` the consumer holding it ('' none), ``idle_ms`` -1 when not pending. In the dead
    letters: ``count`` is its attempts, ``reason`` and ``dead_at`` say why and when, ``dead_entry``
    is the dead-letter stream's entry id."""

    where: str
    sender: str
    tier: str
    sent_at: str
    count: int
    holder: str = ""
    idle_ms: int = -1
    reason: str = ""
    dead_at: str = ""
    dead_entry: str = ""

    @classmethod
    def read(cls, reply: object) -> Place | None:
        if not isinstance(reply, list) or not reply:
            return None
        row = [str(x) for x in reply]
        where, sender, tier, sent_at = row[:4]
        if where == "inbox":
            return cls(where, sender, tier, sent_at, int(row[4]), holder=row[5], idle_ms=int(row[6]))
        return cls(
            where, sender, tier, sent_at, int(row[4] or 0), reason=row[5], dead_at=row[6], dead_entry=row[7]
        )


def peek_call(keys: Keys, agent: str, start: str, limit: int) -> Call:
    """``start``: the first entry id (inclusive, ``(id`` exclusive, or ``-``)."""
    return Call([keys.inbox(agent)], [GROUP, start, limit])


def thread_read_call(keys: Keys, agent: str, envelope_ids: Sequence[str], *, hops: int) -> Call:
    """``lua/thread_read.lua`` for ``envelope_ids`` (checked) on ``agent``'s slot: each is looked up
    with the replies index of its own day (the day of its id, where ``send_append`` notes its replies)."""
    call_keys = [keys.inbox(agent), keys.history(agent), keys.history_positions(agent)]
    positions: dict[int, int] = {}
    args: list[Arg] = [GROUP, hops]
    for one in envelope_ids:
        ms, seq, nonce = decode_envelope_id(one)
        day = ms // DAY_MS
        if day not in positions:
            call_keys.append(keys.replies(agent, day))
            positions[day] = len(call_keys)
        args += (f"{ms}-{seq}", nonce, one, str(positions[day]))
    return Call(call_keys, args)


@dataclass(frozen=True, slots=True)
class ThreadPart:
    """One envelope of ``thread_read.lua``'s reply: the envelope when the agent holds it, and the ids
    of the replies to it the agent received."""

    envelope: StoredEnvelope | None
    replies: tuple[str, ...]

    @classmethod
    def read_all(cls, agent: str, reply: Sequence[Sequence[object]]) -> list[ThreadPart]:
        out = []
        for where, stream_id, fields, deliveries, replies in reply:
            envelope = None
            if where == "inbox":
                envelope = stored(agent, [stream_id, fields, deliveries, 0])
            elif where == "history":
                envelope = archived(agent, str(stream_id), fields).envelope
            out.append(cls(envelope, tuple(str(replies).split())))
        return out


def retire_call(keys: Keys, agent: str, *, purge: bool) -> Call:
    return Call(
        [
            keys.registration(agent),
            keys.retired(agent),
            keys.notice(agent),
            keys.inbox(agent),
            keys.dead_letters(agent),
            keys.history(agent),
            keys.history_positions(agent),
            keys.delivery_counts(agent),
        ],
        [agent, keys.wake_channel(), SUPERSEDED_SESSIONS_KEPT + 1, 1 if purge else 0],
    )


@dataclass(frozen=True, slots=True)
class Retirement:
    """``retire.lua``'s reply: whether the registration ended now, the sessions refused from now on,
    and the inbox's newest entry id for the purge to stop at ('' = nothing to purge)."""

    now: bool
    sessions: tuple[str, ...]
    newest: str

    @classmethod
    def read(cls, reply: Sequence[object]) -> Retirement:
        now, sessions, newest = reply
        return cls(bool(int(str(now))), tuple(str(sessions).split()), str(newest or ""))


def leave_call(keys: Keys, agent: str, session: str) -> Call:
    return Call([keys.registration(agent)], [session])
