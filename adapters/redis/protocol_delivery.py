"""The calling convention of the delivery-queue scripts (``lua/claim.lua``, ``retry.lua``,
``dead_letter.lua``, ``requeue.lua``): the one place their KEYS and ARGV are built, in the order each
script names them at its top, and their replies read (``adapters/redis/protocol.py`` does the same
for a send)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapters.redis.keys import GROUP, Keys
from adapters.redis.protocol import Arg, Call
from adapters.redis.protocol_inbox import HistoryRule
from broker.envelope import format_ms


def claim_call(keys: Keys, agent: str, consumer: str, limit: int, *, visibility_ms: int) -> Call:
    return Call([keys.registration(agent), keys.inbox(agent)], [GROUP, consumer, limit, visibility_ms])


def retry_call(keys: Keys, agent: str, consumer: str, mode: str, entries: Sequence[tuple[str, str]]) -> Call:
    """``mode``: 'retry', 'touch' or 'release'; ``entries``: (stream entry id, nonce) pairs."""
    args: list[Arg] = [GROUP, consumer, mode]
    for pair in entries:
        args += pair
    return Call([keys.inbox(agent)], args)


def read_counts(reply: Sequence[object]) -> list[int]:
    """``retry.lua``'s reply: per entry its delivery count after the re-claim, 0 when not held."""
    return [int(str(one)) for one in reply]


def dead_letter_call(
    keys: Keys,
    agent: str,
    entry: tuple[str, str],
    *,
    consumer: str | None,
    reason: str,
    now: int,
    outcomes: str,
    until: int,
    keep: HistoryRule,
) -> Call:
    """``keep``: what the history keeps (``protocol_inbox.HistoryRule``)."""
    stream_id, nonce = entry
    return Call(
        [
            keys.inbox(agent),
            keys.dead_letters(agent),
            outcomes,
            keys.history(agent),
            keys.history_positions(agent),
        ],
        [
            GROUP,
            stream_id,
            nonce,
            consumer or "",
            reason,
            format_ms(now),
            until,
            keep.retention_ms,
            keep.max_bytes,
        ],
    )


def requeue_call(
    keys: Keys,
    agent: str,
    wanted: Sequence[str],
    nonces: Sequence[str],
    *,
    lineage: int,
    outcomes: str,
    until: int,
) -> Call:
    """``wanted``: envelope ids (none: the oldest dead letters); one fresh nonce per entry to move."""
    args: list[Arg] = [GROUP, keys.wake_channel(), agent, until, lineage, len(wanted), *wanted, *nonces]
    return Call([keys.dead_letters(agent), keys.inbox(agent), outcomes, keys.history_positions(agent)], args)


@dataclass(frozen=True, slots=True)
class Requeued:
    """One entry of ``requeue.lua``'s reply: the old envelope id, the new stream entry id and nonce."""

    old: str
    stream_id: str
    nonce: str

    @classmethod
    def read_all(cls, reply: Sequence[object]) -> list[Requeued]:
        return [cls(str(reply[i]), str(reply[i + 1]), str(reply[i + 2])) for i in range(0, len(reply) - 2, 3)]
