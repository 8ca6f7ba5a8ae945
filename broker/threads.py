"""Conversations: envelopes linked through the ``in_reply_to`` field of their bodies.

``linked`` is the one definition of a thread, shared by every ``IOperatorView``: starting from an
envelope id, follow ``in_reply_to`` up to the root (as far as the envelopes are still stored), then
collect every envelope that answers one already collected, transitively. Ordered by the millisecond
accepted, and within one millisecond every answer after what it answers. A requeued dead letter is
the envelope it was: an id it had before (``StoredEnvelope.requeued_from``) names it, so a reply to the
old id answers it and a thread asked for by the old id finds it; the old one kept in a history is not
shown beside it.
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
    every = list(envelopes)
    # a requeued dead letter's earlier self may still be in its agent's history: it is the same
    # envelope, shown once, as what it became
    renamed = {old for e in every for old in e.requeued_from}
    by_id = {e.envelope_id: e for e in every if e.envelope_id not in renamed}
    now_named = {old: e.envelope_id for e in by_id.values() for old in e.requeued_from if old not in by_id}

    def now_of(one: str) -> str:
        return now_named.get(one, one)

    replies: dict[str, list[str]] = {}
    for e in by_id.values():
        parent = e.fields.get(IN_REPLY_TO)
        if parent:
            replies.setdefault(now_of(parent), []).append(e.envelope_id)
    root = now_of(envelope_id)
    seen = {root}
    while (
        (up := by_id.get(root)) is not None
        and (parent := up.fields.get(IN_REPLY_TO))
        and (parent := now_of(parent)) not in seen
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
