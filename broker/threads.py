"""Conversations: envelopes linked through the ``in_reply_to`` field of their bodies.

``linked`` is the one definition of a thread, shared by every ``IOperatorView``: starting from an
envelope id, follow ``in_reply_to`` up to the root (as far as the envelopes are still stored), then
collect every envelope that answers one already collected, transitively. Ordered by the millisecond
accepted, and within one millisecond every answer after what it answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from broker.ids import decode_envelope_id
from broker.ports import StoredEnvelope

IN_REPLY_TO: Final = "in_reply_to"
"""The body field naming the envelope a message answers."""


def linked(envelope_id: str, envelopes: Iterable[StoredEnvelope], limit: int = 1000) -> list[StoredEnvelope]:
    """The thread of ``envelope_id`` among ``envelopes``: at most ``limit``, oldest first."""
    by_id = {e.envelope_id: e for e in envelopes}
    replies: dict[str, list[str]] = {}
    for e in by_id.values():
        parent = e.fields.get(IN_REPLY_TO)
        if parent:
            replies.setdefault(parent, []).append(e.envelope_id)
    root, seen = envelope_id, {envelope_id}
    while (
        (up := by_id.get(root)) is not None and (parent := up.fields.get(IN_REPLY_TO)) and parent not in seen
    ):
        seen.add(parent)
        root = parent
    depth: dict[str, int] = {}
    todo = [(root, 0)]
    while todo:
        current, level = todo.pop()
        if current in depth:
            continue
        depth[current] = level
        todo.extend((child, level + 1) for child in replies.get(current, ()))

    def order(envelope: StoredEnvelope) -> tuple[int, int, int, str]:
        # envelopes of different inboxes accepted in the same millisecond: an answer after its question
        ms, seq, _ = decode_envelope_id(envelope.envelope_id)
        return (ms, depth[envelope.envelope_id], seq, envelope.envelope_id)

    return sorted((by_id[m] for m in depth if m in by_id), key=order)[:limit]
