"""The calling convention of the send scripts: the one place their KEYS and ARGV are built and their
replies read. Each ``lua/*.lua`` names its KEYS and ARGV once at its top; the builders here put them
in that order, and the reply dataclasses name what comes back.

A send is ``send_check`` on the sender's slot, ``send_append`` on the recipient's, and, after a
refusal of step 2, ``send_refund`` on the sender's slot again (or, when a repeated key's first attempt
never landed, ``send_note``). ``SendCall`` builds all four calls from one set of values; on a cluster
``RedisInboxStore`` runs them one by one, on one Redis ``lua/send.lua`` runs the same four in one
script (``SendCall.combined``), filling in the three values only step 1 knows (the sender's tier and
provider, the rate token to give back).
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
    """The calls of one send. ``check`` and ``append`` always run; the refund and the note run only
    after what step 1 and step 2 answered, so they are built from the values they share with ``check``
    when asked for (``refund``, ``note``) rather than on every send."""

    check: Call
    append: Call
    undo_keys: list[str]
    """``send_refund``'s KEYS: the sender's rate hash, its status index of the day, and the
    idempotency claim when the send names a key (``send_note``'s one KEY is the status index)."""
    nonce: str
    index_value: str
    index_until: int
    """0: no status is kept, so there is no note."""

    def refund(self, burst: int) -> Call:
        """``send_refund``'s call giving back the token ``send_check`` took (``burst``: its
        ``SendChecked.refund_burst``; 0: none)."""
        return Call(self.undo_keys, [burst, self.nonce, 1 if len(self.undo_keys) > 2 else 0])

    def note(self) -> Call | None:
        """``send_note``'s call; None when no status is kept."""
        if not self.index_until:
            return None
        return Call([self.undo_keys[1]], [self.nonce, self.index_value, self.index_until])

    def combined(self) -> Call:
        """The KEYS and ARGV of ``lua/send.lua``: how many KEYS and ARGV each of the four calls takes
        (eight counts), then each call's KEYS, and each call's ARGV, in the order check, append,
        refund, note (the refund's token is 0 here: the script fills it in from step 1)."""
        check, append, undo = self.check, self.append, self.undo_keys
        noted = 1 if self.index_until else 0
        # the refund's and the note's lists spelled in place, as ``refund`` and ``note`` spell them (a
        # send runs this every time; the two Call objects would cost a fifth of it), and list
        # concatenation: tests/test_script_protocol.py runs one story through both ways and compares
        args: list[Arg] = [len(check.keys), len(append.keys), len(undo), noted]
        args += (len(check.args), len(append.args), 3, 3 * noted)
        args += check.args
        args += append.args
        args += (0, self.nonce, 1 if len(undo) > 2 else 0)
        if noted:
            args += (self.nonce, self.index_value, self.index_until)
        return Call(check.keys + append.keys + undo + undo[1:2] * noted, args)


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
    rate = keys.rate(sender)
    request, window = options.request_hash or "", settings.idempotency_window_ms
    index_value = f"{to} {sent_at_ms}"
    check_keys = [keys.registration(sender), rate, day_index, keys.retired(sender)]
    append_keys = [keys.registration(to), keys.inbox(to)]
    undo_keys = [rate, day_index]
    key = options.idempotency_key
    if key is not None:
        claim = keys.idempotency_claim(sender, key)
        check_keys.append(claim)
        undo_keys.append(claim)
        append_keys.append(keys.idempotency_record(to, sender, key))
    check_args: list[Arg] = [
        session or "",
        repr(float(settings.send_rate)),
        settings.send_burst,
        request,
        window,
        nonce,
        index_value,
        index_until,
    ]
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
    if parent and is_envelope_id(parent):
        parent_day = decode_envelope_id(parent)[0] // DAY_MS
        append_keys.append(keys.replies(to, parent_day))
        append_args += (parent, replies_until(parent_day))
    else:
        append_args += ("", 0)
    for item in fields.items():
        append_args += item
    append_args.append("")  # the sender's provider, last: SendChecked.provider
    append_keys.append(keys.policy(to))
    return SendCall(
        Call(check_keys, check_args),
        Call(append_keys, append_args),
        undo_keys,
        nonce,
        index_value,
        index_until,
    )


_SENDER_TIER = 1
"""Where in ``send_append``'s ARGV the sender's tier goes (``lua/send_append.lua``: ARGV[2])."""


def with_tier(call: Call, tier: str, provider: str) -> Call:
    """``send_append``'s call with the sender's tier and provider that ``send_check`` answered (the
    provider is its last ARGV: ``lua/send_append.lua``'s contact policy reads it)."""
    args = list(call.args)
    args[_SENDER_TIER], args[-1] = tier, provider
    return Call(call.keys, args)


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
