"""Conversations: envelopes linked through the ``in_reply_to`` field of their bodies.

``linked`` is the one definition of a thread, shared by every ``IOperatorView``: starting from an
envelope id, follow ``in_reply_to`` up to the root (as far as the envelopes are still stored), then
collect every envelope that answers one already collected, transitively. Ordered by time accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from broker.ids import decode_envelope_id
from broker.ports import StoredEnvelope

IN_REPLY_TO: Final = "in_reply_to"
"""The body field naming the envelope a message answers."""


def order_key(envelope: StoredEnvelope) -> tuple[int, int, str]:
    """Time accepted, then the store's sequence: the order a thread is shown in."""
    ms, seq, _ = decode_envelope_id(envelope.envelope_id)
    return (ms, seq, envelope.envelope_id)


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
    members: set[str] = set()
    todo = [root]
    while todo:
        current = todo.pop()
        if current in members:
            continue
        members.add(current)
        todo.extend(replies.get(current, ()))
    found = sorted((by_id[m] for m in members if m in by_id), key=order_key)
    return found[:limit]
