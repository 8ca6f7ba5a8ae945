"""Identifier rules: agent ids, session ids and envelope ids.

Every identifier that enters relay is checked here, once, at the boundary. Agent ids become part of
Redis key names, so their alphabet excludes everything that could inject into a key (``:``, ``{}``,
``*``, spaces, control characters, non-ASCII).

Envelope ids are opaque to clients. Internally an id is ``env_`` followed by 26 Crockford base32
characters: 10 encode the inbox position's millisecond, 6 its sequence within that millisecond, and
10 a random nonce. The position lets a store find the entry without an index; the nonce makes ids
unique across the whole relay (two inboxes may share a position) and unguessable, so an agent cannot
acknowledge an envelope it was never given.
"""

from __future__ import annotations

import functools
import os
import re
from collections import deque
from typing import Final

from broker.errors import InvalidArgument

AGENT_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""Agent ids: 1..64 of lowercase ASCII letters, digits, '.', '_', '-'; first a letter or digit."""

SESSION_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Session ids: 1..128 of ASCII letters, digits, '.', '_', '-'; first a letter or digit."""

ENVELOPE_ID_PATTERN: Final = r"^env_[0-9A-HJKMNP-TV-Z]{26}$"
"""Envelope ids, as they appear in ``in_reply_to`` and in acknowledgements."""

IDEMPOTENCY_KEY_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}$"
"""Idempotency keys of a send: 1..128 of ASCII letters, digits, '.', '_', ':', '-' (no braces or
spaces, so a key can be part of a Redis key name)."""

_AGENT_RE: Final = re.compile(AGENT_ID_PATTERN)
_SESSION_RE: Final = re.compile(SESSION_ID_PATTERN)
_ENVELOPE_RE: Final = re.compile(ENVELOPE_ID_PATTERN)
_IDEMPOTENCY_KEY_RE: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)

_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_MS_CHARS: Final = 10
_SEQ_CHARS: Final = 6
NONCE_CHARS: Final = 10
_MAX_SEQ: Final = 32**_SEQ_CHARS - 1
_MAX_MS: Final = 32**_MS_CHARS - 1
_SEQ_BITS: Final = 5 * _SEQ_CHARS
# Two base32 characters per 10 bits, by table: the ids are built and read on every send/fetch/ack.
_PAIRS: Final = tuple(a + b for a in _ALPHABET for b in _ALPHABET)
_PAIR_VALUES: Final = {pair: i for i, pair in enumerate(_PAIRS)}


def check_agent_id(value: object, field: str = "agent") -> str:
    """Return ``value`` if it is a valid agent id, else raise ``InvalidArgument`` naming ``field``."""
    if isinstance(value, str) and _valid_agent_id(value):
        return value
    raise InvalidArgument(
        field,
        "agent_id.pattern",
        f"{_show(value)} is not a valid agent id: use 1-64 lowercase letters, digits, '.', '_' "
        "or '-', starting with a letter or digit",
    )


def check_session_id(value: object, field: str = "session") -> str:
    """Return ``value`` if it is a valid session id, else raise ``InvalidArgument`` naming ``field``."""
    if isinstance(value, str) and _valid_session_id(value):
        return value
    raise InvalidArgument(
        field,
        "session_id.pattern",
        f"{_show(value)} is not a valid session id: use 1-128 ASCII letters, digits, '.', '_' "
        "or '-', starting with a letter or digit",
    )


# Every call checks the same few agents and sessions again; a cached answer costs a third of the regex.
@functools.lru_cache(maxsize=4096)
def _valid_agent_id(value: str) -> bool:
    return _AGENT_RE.fullmatch(value) is not None


@functools.lru_cache(maxsize=4096)
def _valid_session_id(value: str) -> bool:
    return _SESSION_RE.fullmatch(value) is not None


def check_idempotency_key(value: object) -> str:
    """Return ``value`` if it is a valid idempotency key, else raise ``InvalidArgument``."""
    if isinstance(value, str) and _IDEMPOTENCY_KEY_RE.fullmatch(value) is not None:
        return value
    raise InvalidArgument(
        "idempotency_key",
        "idempotency_key.pattern",
        f"{_show(value)} is not a valid idempotency key: use 1-128 ASCII letters, digits, '.', '_', ':' "
        "or '-'",
    )


def is_envelope_id(value: object) -> bool:
    return isinstance(value, str) and _ENVELOPE_RE.fullmatch(value) is not None


# Nonces are 50-bit values cut from the OS's CSPRNG (``os.urandom``, what ``secrets`` uses) 64 at a
# time: one system call per 64 sends instead of one per send. ``deque.popleft`` is atomic, so threads
# never share a value; a forked child drops the parent's unused values.
_NONCE_POOL: Final[deque[int]] = deque()
_NONCE_BATCH: Final = 64


def _refill_nonces() -> None:
    words = memoryview(os.urandom(8 * _NONCE_BATCH)).cast("Q")
    _NONCE_POOL.extend(word >> (64 - 5 * NONCE_CHARS) for word in words)


os.register_at_fork(after_in_child=_NONCE_POOL.clear)


def new_nonce() -> str:
    """``NONCE_CHARS`` random Crockford base32 characters (50 bits from the OS's CSPRNG)."""
    while True:
        try:
            v = _NONCE_POOL.popleft()
            break
        except IndexError:
            _refill_nonces()
    p = _PAIRS
    return p[v >> 40] + p[(v >> 30) & 1023] + p[(v >> 20) & 1023] + p[(v >> 10) & 1023] + p[v & 1023]


def encode_envelope_id(ms: int, seq: int, nonce: str) -> str:
    """Build the envelope id of the inbox entry at position ``ms-seq`` carrying ``nonce``."""
    if not 0 <= seq <= _MAX_SEQ:
        raise ValueError(f"sequence {seq} does not fit an envelope id")
    if not 0 <= ms <= _MAX_MS:
        raise ValueError("value does not fit")
    p = _PAIRS  # 50 bits of ms then 30 of seq: 80 bits, 16 characters
    return _ms_head(ms) + p[seq >> 20] + p[(seq >> 10) & 1023] + p[seq & 1023] + nonce


@functools.lru_cache(maxsize=16)
def _ms_head(ms: int) -> str:
    """``env_`` and the millisecond's 10 characters (ids made together mostly share their millisecond)."""
    p = _PAIRS
    return (
        "env_"
        + p[ms >> 40]
        + p[(ms >> 30) & 1023]
        + p[(ms >> 20) & 1023]
        + p[(ms >> 10) & 1023]
        + p[ms & 1023]
    )


def decode_envelope_id(envelope_id: str) -> tuple[int, int, str]:
    """Return ``(ms, seq, nonce)``; the caller has checked ``is_envelope_id``."""
    d = _PAIR_VALUES
    e = envelope_id
    ms = d[e[4:6]] << 40 | d[e[6:8]] << 30 | d[e[8:10]] << 20 | d[e[10:12]] << 10 | d[e[12:14]]
    seq = d[e[14:16]] << 20 | d[e[16:18]] << 10 | d[e[18:20]]
    return ms, seq, e[20:]


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
