"""The calling convention of the send scripts: the one place their KEYS and ARGV are built and their
replies read. Each ``lua/*.lua`` names its KEYS and ARGV once at its top; the builders here put them
in that order, and the reply dataclasses name what comes back.

A send is ``send_check`` on the sender's slot, ``send_append`` on the recipient's, and, after a
refusal of step 2, ``send_refund`` on the sender's slot again (or, when a repeated key's first attempt
never landed, ``send_note``). ``SendCall`` holds all four calls, built before anything runs; on a
cluster ``RedisInboxStore`` runs them one by one, on one Redis ``lua/send.lua`` runs the same four in
one script (``SendCall.combined``), filling in the three values only step 1 knows (the sender's tier
and provider, the rate token to give back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from adapters.redis.connection import RedisSettings
from adapters.redis.keys import GROUP, Keys
from broker.envelope import format_ms
from broker.ids import decode_envelope_id, is_envelope_id
from broker.ports import SendOptions

Arg = str | int
DAY_MS = 24 * 3600 * 1000
"""The day of a key named by day (days since the epoch, UTC)."""


@dataclass(frozen=True, slots=True)
class Call:
    """The KEYS and ARGV of one script call."""

    keys: list[str]
    args: list[Arg]


@dataclass(frozen=True, slots=True)
class SendCall:
    check: Call
    append: Call
    refund: Call
    """Its first argument (the token to give back) comes from ``SendChecked.refund_burst``."""
    note: Call | None
    """None when no status is kept."""

    def combined(self) -> Call:
        """The KEYS and ARGV of ``lua/send.lua``: how many KEYS and ARGV each of the four calls takes
        (eight counts), then each call's KEYS, and each call's ARGV, in the order check, append,
        refund, note."""
        check, append, refund, note = self.check, self.append, self.refund, self.note or _NONE
        # list concatenation: a third of what comprehensions over the four calls cost, on every send
        counts: list[Arg] = [len(check.keys), len(append.keys), len(refund.keys), len(note.keys)]
        counts += (len(check.args), len(append.args), len(refund.args), len(note.args))
        return Call(
            check.keys + append.keys + refund.keys + note.keys,
            counts + check.args + append.args + refund.args + note.args,
        )


_NONE = Call([], [])


def send_call(
    keys: Keys,
    settings: RedisSettings,
    sender: str,
    to: str,
    fields: Mapping[str, str],
    *,
    sent_at_ms: int,
    session: str | None,
    options: SendOptions,
    nonce: str,
    day: int,
    index_until: int,
    replies_until: Callable[[int], int] = lambda day: 0,
) -> SendCall:
    """The calls of one send noted under ``day`` (days since the epoch); ``index_until``: when the
    sender's status index of that day expires (ms since the epoch; 0 = keep no status);
    ``replies_until(day)``: when the replies index of a day expires."""
    day_index = keys.sent_index(sender, day)
    request, window = options.request_hash or "", settings.idempotency_window_ms
    key = options.idempotency_key
    claim = [] if key is None else [keys.idempotency_claim(sender, key)]
    record = [] if key is None else [keys.idempotency_record(to, sender, key)]
    index_value = f"{to} {sent_at_ms}"
    check = Call(
        [keys.registration(sender), keys.rate(sender), day_index, keys.retired(sender), *claim],
        [
            session or "",
            repr(float(settings.send_rate)),
            settings.send_burst,
            request,
            window,
            nonce,
            index_value,
            index_until,
        ],
    )
    expires = str(options.expires_at_ms) if options.expires_at_ms is not None else ""
    append_args: list[Arg] = [
        sender,
        "",  # the sender's tier: SendChecked.tier
        format_ms(sent_at_ms),
        nonce,
        settings.inbox_cap,
        GROUP,
        keys.wake_channel(),
        to,
        expires,
        request,
        window,
        sent_at_ms,
    ]
    parent = fields.get("in_reply_to", "")
    replies: list[str] = []
    if parent and is_envelope_id(parent):
        parent_day = decode_envelope_id(parent)[0] // DAY_MS
        replies = [keys.replies(to, parent_day)]
        append_args += (parent, replies_until(parent_day))
    else:
        append_args += ("", 0)
    for name, value in fields.items():
        append_args += (name, value)
    append_args.append("")  # the sender's provider, last: SendChecked.provider
    refund = Call([keys.rate(sender), day_index, *claim], [0, nonce, 1 if claim else 0])
    note = Call([day_index], [nonce, index_value, index_until]) if index_until else None
    append = Call([keys.registration(to), keys.inbox(to), *record, *replies, keys.policy(to)], append_args)
    return SendCall(check, append, refund, note)


_SENDER_TIER = 1
"""Where in ``send_append``'s ARGV the sender's tier goes (``lua/send_append.lua``: ARGV[2])."""


def with_tier(call: Call, tier: str, provider: str) -> Call:
    """``send_append``'s call with the sender's tier and provider that ``send_check`` answered (the
    provider is its last ARGV: ``lua/send_append.lua``'s contact policy reads it)."""
    args = list(call.args)
    args[_SENDER_TIER], args[-1] = tier, provider
    return Call(call.keys, args)


def with_refund(call: Call, burst: int) -> Call:
    """``send_refund``'s call giving back the token ``send_check`` took (``burst``; 0: none)."""
    return Call(call.keys, [burst, *call.args[1:]])


@dataclass(frozen=True, slots=True)
class SendChecked:
    """``send_check``'s reply: the sender's tier label, whether the idempotency key was seen before,
    the bucket size to give a rate token back with if step 2 refuses (0: none was taken), and the
    sender's provider ('' when it has none)."""

    tier: str
    repeat: bool
    refund_burst: int
    provider: str

    @classmethod
    def read(cls, reply: Sequence[object]) -> SendChecked:
        tier, repeat, burst, provider = reply
        return cls(str(tier), bool(int(str(repeat))), int(str(burst)), str(provider))


@dataclass(frozen=True, slots=True)
class SendAppended:
    """``send_append``'s (and ``send.lua``'s) reply: the stream entry id, the tier label the envelope
    travels at, its nonce, its sent_at (ms) and whether an idempotency record answered."""

    stream_id: str
    tier: str
    nonce: str
    sent_at_ms: int
    repeat: bool

    @classmethod
    def read(cls, reply: Sequence[object]) -> SendAppended:
        stream_id, tier, nonce, sent_ms, repeat = reply
        return cls(str(stream_id), str(tier), str(nonce), int(str(sent_ms)), bool(int(str(repeat))))
