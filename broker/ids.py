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

import re
import secrets
from typing import Final

from broker.errors import InvalidArgument

AGENT_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""Agent ids: 1..64 of lowercase ASCII letters, digits, '.', '_', '-'; first a letter or digit."""

SESSION_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Session ids: 1..128 of ASCII letters, digits, '.', '_', '-'; first a letter or digit."""

ENVELOPE_ID_PATTERN: Final = r"^env_[0-9A-HJKMNP-TV-Z]{26}$"
"""Envelope ids, as they appear in ``in_reply_to`` and in acknowledgements."""

_AGENT_RE: Final = re.compile(AGENT_ID_PATTERN)
_SESSION_RE: Final = re.compile(SESSION_ID_PATTERN)
_ENVELOPE_RE: Final = re.compile(ENVELOPE_ID_PATTERN)

_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE: Final = {c: i for i, c in enumerate(_ALPHABET)}
_MS_CHARS: Final = 10
_SEQ_CHARS: Final = 6
NONCE_CHARS: Final = 10
_MAX_SEQ: Final = 32**_SEQ_CHARS - 1


def check_agent_id(value: object, field: str = "agent") -> str:
    """Return ``value`` if it is a valid agent id, else raise ``InvalidArgument`` naming ``field``."""
    if not isinstance(value, str) or _AGENT_RE.fullmatch(value) is None:
        raise InvalidArgument(
            field,
            "agent_id.pattern",
            f"{_show(value)} is not a valid agent id: use 1-64 lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit",
        )
    return value


def check_session_id(value: object, field: str = "session") -> str:
    """Return ``value`` if it is a valid session id, else raise ``InvalidArgument`` naming ``field``."""
    if not isinstance(value, str) or _SESSION_RE.fullmatch(value) is None:
        raise InvalidArgument(
            field,
            "session_id.pattern",
            f"{_show(value)} is not a valid session id: use 1-128 ASCII letters, digits, '.', '_' "
            "or '-', starting with a letter or digit",
        )
    return value


def is_envelope_id(value: object) -> bool:
    return isinstance(value, str) and _ENVELOPE_RE.fullmatch(value) is not None


def new_nonce() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(NONCE_CHARS))


def encode_envelope_id(ms: int, seq: int, nonce: str) -> str:
    """Build the envelope id of the inbox entry at position ``ms-seq`` carrying ``nonce``."""
    if not 0 <= seq <= _MAX_SEQ:
        raise ValueError(f"sequence {seq} does not fit an envelope id")
    return "env_" + _b32(ms, _MS_CHARS) + _b32(seq, _SEQ_CHARS) + nonce


def decode_envelope_id(envelope_id: str) -> tuple[int, int, str]:
    """Return ``(ms, seq, nonce)``; the caller has checked ``is_envelope_id``."""
    body = envelope_id[4:]
    ms = _unb32(body[:_MS_CHARS])
    seq = _unb32(body[_MS_CHARS : _MS_CHARS + _SEQ_CHARS])
    return ms, seq, body[_MS_CHARS + _SEQ_CHARS :]


def _b32(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        value, rem = divmod(value, 32)
        out.append(_ALPHABET[rem])
    if value:
        raise ValueError("value does not fit")
    return "".join(reversed(out))


def _unb32(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 32 + _DECODE[ch]
    return value


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
