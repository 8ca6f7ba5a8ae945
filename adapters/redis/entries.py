"""The inbox stream entry layout, on the Python side (``lua/_entry.lua`` is its Lua twin).

One entry is one envelope: ``from``, ``tier``, ``sent_at`` (ISO-8601 UTC), ``expires_at`` (ms since
the epoch, only with a ttl), the contract's body fields, ``nonce``; a requeued dead letter also
carries ``requeued_from``. The envelope id is made of the entry id (milliseconds and sequence) and the
nonce. Scripts that hand entries out return rows
``[entry id, [field, value, ...], deliveries, first (1|0)]``; ``stored`` decodes one. Dead letters
keep the header and body and add ``envelope_id``, ``attempts``, ``reason`` and ``dead_at``. History
entries keep every field and add ``entry_id``, ``attempts``, ``outcome`` and (dead-lettered only)
``reason``; their own id is when the envelope left the inbox (``archived``).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.delivery import DEAD_LETTER_FIELDS, REQUEUED_FROM, DeadLetter
from broker.envelope import Tier, parse_ms
from broker.ids import decode_envelope_id, encode_envelope_id
from broker.ports import Announced, Archived, StoredEnvelope

FROM, TIER, SENT_AT, EXPIRES_AT, NONCE = "from", "tier", "sent_at", "expires_at", "nonce"
HISTORY_FIELDS = ("entry_id", "attempts", "outcome", "reason")
"""What a history entry adds to the entry's own fields (``entry_archive`` in ``lua/_entry.lua``)."""
HEADER = (FROM, TIER, SENT_AT)
"""Fields before the body; ``NONCE`` comes after it."""
ENVELOPE_FIELDS = frozenset({*HEADER, EXPIRES_AT, NONCE})
_TIERS = {tier.label: tier for tier in Tier}


def entry_id(envelope_id: str) -> tuple[str, str]:
    """(stream entry id, nonce) of a checked envelope id."""
    ms, seq, nonce = decode_envelope_id(envelope_id)
    return f"{ms}-{seq}", nonce


def envelope_id(stream_id: str, nonce: str) -> str:
    ms, _, seq = stream_id.partition("-")
    return encode_envelope_id(int(ms), int(seq), nonce)


def entry_ms(stream_id: str) -> int:
    """The milliseconds part of a stream entry id (``1764423912345-0``): when Redis added it."""
    return int(stream_id.partition("-")[0])


def fields_of(values: object) -> dict[str, str]:
    """An entry's fields from a reply: a flat ``[name, value, ...]`` list or a mapping."""
    if type(values) is list:
        pairs = iter(values)
        return {str(k): str(v) for k, v in zip(pairs, pairs, strict=False)}
    if isinstance(values, dict):
        return {str(k): str(v) for k, v in values.items()}
    return {}


def tier_of(label: str) -> Tier:
    return _TIERS.get(label) or Tier.from_label(label or "network")


def stored(agent: str, row: Sequence[object]) -> StoredEnvelope:
    """One ``[entry id, fields, deliveries, first]`` row of ``agent``'s inbox."""
    stream_id, values, deliveries, first = row
    fields = fields_of(values)
    sender = fields.pop(FROM, "")
    tier = fields.pop(TIER, "")
    sent_at = fields.pop(SENT_AT, "")
    nonce = fields.pop(NONCE, "")
    expires_at = fields.pop(EXPIRES_AT, None)
    requeued_from = fields.pop(REQUEUED_FROM, "")  # set on dead letters brought back; not in the body
    return StoredEnvelope(
        envelope_id=envelope_id(str(stream_id), nonce),
        sender=sender,
        to=agent,
        tier=tier_of(tier),
        sent_at_ms=parse_ms(sent_at),
        fields=fields,
        deliveries=int(str(deliveries)),
        first_delivery=bool(int(str(first))),
        expires_at_ms=int(expires_at) if expires_at else None,
        requeued_from=tuple(requeued_from.split()),
    )


def announced(row: Sequence[object]) -> Announced:
    """One ``[entry id, fields]`` row of a notice (``lua/notice.lua``)."""
    stream_id, values = row
    fields = fields_of(values)
    sender = fields.pop(FROM, "")
    tier = fields.pop(TIER, "")
    sent_at = fields.pop(SENT_AT, "")
    nonce = fields.pop(NONCE, "")
    fields.pop(REQUEUED_FROM, None)
    return Announced(envelope_id(str(stream_id), nonce), sender, tier_of(tier), parse_ms(sent_at), fields)


def rows(agent: str, reply: object) -> list[StoredEnvelope]:
    return [stored(agent, row) for row in reply] if isinstance(reply, list) else []


def dead_letter(agent: str, values: object) -> DeadLetter:
    """One entry of ``agent``'s dead-letter stream."""
    fields = fields_of(values)
    meta = {k: fields.pop(k, "") for k in DEAD_LETTER_FIELDS}
    header = {k: fields.pop(k, "") for k in HEADER}
    fields.pop(EXPIRES_AT, None)
    requeued_from = fields.pop(REQUEUED_FROM, "")
    return DeadLetter(
        envelope_id=meta["envelope_id"],
        sender=header[FROM],
        to=agent,
        tier=tier_of(header[TIER]),
        sent_at_ms=parse_ms(header[SENT_AT]),
        fields=fields,
        attempts=int(meta["attempts"] or 0),
        reason=meta["reason"],
        dead_at_ms=parse_ms(meta["dead_at"]),
        requeued_from=tuple(requeued_from.split()),
    )


def archived(agent: str, history_id: str, values: object) -> Archived:
    """One entry (id, fields) of ``agent``'s history stream."""
    fields = fields_of(values)
    meta = {k: fields.pop(k, "") for k in HISTORY_FIELDS}
    envelope = stored(agent, [meta["entry_id"] or "0-0", fields, meta["attempts"] or 0, 0])
    return Archived(envelope, meta["outcome"], meta["reason"] or None, entry_ms(history_id), history_id)
