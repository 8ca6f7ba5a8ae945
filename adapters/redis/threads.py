"""A thread read on Redis that costs in proportion to the thread, never to the store.

``send_append.lua`` notes each reply under the envelope it answers, in its recipient's replies index
(``Keys.replies``); the scripts that archive an envelope note where its history entry is
(``Keys.history_positions``). ``walk`` starts from the agent holding the envelope asked about (one
pipelined round over the agents finds it), then, round by round, asks each envelope's two participants
(its sender and its recipient) for it: ``thread_read.lua`` on their slots answers the envelope when
that agent holds it and the replies to it that agent received. A reply answers what its sender got or
sent, so its parent's participants include its own: every link between participants is found, one
round per step along the thread, and only the envelopes of the thread are ever read.

A reply whose sender and recipient both took no part in the envelope it answers is not indexed where
the walk looks; neither is what was sent before the index existed: when the index finds nothing of
the envelope asked about, ``RedisOperatorView.thread`` reads the whole store instead (the old scan),
and ``relay migrate`` notes the replies of a store written before the index (``index_replies``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import Redis, RedisCluster

from adapters.redis.connection import RedisConnection
from adapters.redis.entries import NONCE, envelope_id, fields_of
from adapters.redis.inbox import retained_until
from adapters.redis.protocol import DAY_MS
from adapters.redis.protocol_operator import ThreadPart, thread_read_call
from broker.ids import decode_envelope_id, is_envelope_id
from broker.limits import REQUEUE_LINEAGE
from broker.ports import StoredEnvelope
from broker.threads import IN_REPLY_TO

MAX_ROUNDS: Final = 64
"""Rounds of one walk at most (a thread deeper than this is shown to that depth)."""
MAX_ASKED: Final = 10_000
"""Envelope lookups of one walk at most."""
_PAGE = 1000


async def _read(connection: RedisConnection, agent: str, ids: Sequence[str]) -> list[ThreadPart]:
    call = thread_read_call(connection.keys, agent, ids, hops=REQUEUE_LINEAGE)
    reply = await connection.script(connection.scripts.thread_read, call.keys, call.args, idempotent=True)
    return ThreadPart.read_all(agent, reply)


async def walk(connection: RedisConnection, envelope_id: str, agents: Sequence[str]) -> list[StoredEnvelope]:
    """The envelopes linked to ``envelope_id`` that the index reaches (unordered); ``agents``: where
    to look for ``envelope_id`` itself."""
    held: dict[str, StoredEnvelope] = {}
    asked: set[tuple[str, str]] = set()
    todo: dict[str, set[str]] = {a: {envelope_id} for a in agents}

    def ask(agent: str, one: str | None) -> None:
        if one and is_envelope_id(one) and (agent, one) not in asked and len(asked) < MAX_ASKED:
            todo.setdefault(agent, set()).add(one)

    for _ in range(MAX_ROUNDS):
        if not todo:
            break
        batch = {a: sorted(ids) for a, ids in todo.items()}
        todo = {}
        asked.update((a, one) for a, ids in batch.items() for one in ids)
        parts = await asyncio.gather(*(_read(connection, a, ids) for a, ids in batch.items()))
        for (agent, ids), answers in zip(batch.items(), parts, strict=True):
            for one, part in zip(ids, answers, strict=True):
                for reply in part.replies:
                    ask(agent, reply)  # the reply is in this agent's inbox or history
                envelope = part.envelope
                if envelope is None or envelope.envelope_id in held:
                    continue
                held[envelope.envelope_id] = envelope
                names = {one, envelope.envelope_id, *envelope.requeued_from}
                for name in names:  # replies its sender received, to any name it had
                    ask(envelope.sender, name)
                    ask(agent, name)
                parent = envelope.fields.get(IN_REPLY_TO)
                ask(agent, parent)
                ask(envelope.sender, parent)
    return list(held.values())


async def index_replies(connection: RedisConnection, agents: Sequence[str], *, dry_run: bool = False) -> int:
    """Note in the replies index every stored reply of ``agents`` (the registered ones) that is not
    there yet (envelopes sent before the index, for ``relay migrate``): every inbox and history is read
    once, in pages; returns how many replies were (or, with ``dry_run``, would be) noted. Idempotent: a
    second run notes none."""
    keys = connection.keys
    until = connection.settings.history_retention_ms
    added = 0
    for agent in agents:
        for key in (keys.inbox(agent), keys.history(agent)):
            start = "-"
            while True:

                async def page(client: Redis | RedisCluster, key: str = key, start: str = start) -> Any:
                    return await client.xrange(key, start, "+", count=_PAGE)

                entries = await connection.call(page, idempotent=True)
                for stream_id, values in entries:
                    fields = fields_of(values)
                    parent = fields.get(IN_REPLY_TO, "")
                    if not is_envelope_id(parent):
                        continue
                    child = envelope_id(fields.get("entry_id") or str(stream_id), fields.get(NONCE, ""))
                    day = decode_envelope_id(parent)[0] // DAY_MS
                    note = _Note(keys.replies(agent, day), parent, child, day, until, dry_run)
                    added += await connection.call(note.run, idempotent=True)
                if len(entries) < _PAGE:
                    break
                start = f"({entries[-1][0]}"
    return added


@dataclass(frozen=True, slots=True)
class _Note:
    """One reply to note under ``parent`` in the replies index ``key`` (``relay migrate``'s only write;
    new replies are noted by ``send_append.lua``)."""

    key: str
    parent: str
    child: str
    day: int
    retention: int
    dry_run: bool

    async def run(self, client: Redis | RedisCluster) -> int:
        known = str(await client.hget(self.key, self.parent) or "")
        if self.child in known.split():
            return 0
        if not self.dry_run:
            await client.hset(self.key, self.parent, f"{known} {self.child}".strip())
            await client.pexpireat(self.key, retained_until(self.day, max(self.retention, DAY_MS)))
        return 1
