"""What history costs (docs/history.md), and the ``history`` part of ``bench/run.py``:

    python bench/history.py [STORED] [--through-relay]   # default 1,000,000 stored; a few minutes
    python bench/run.py --only history   # the same figures as the part (--quick: 100,000 stored)

1. Bytes: one sender sends 20,000 envelopes (a 300-byte text, then a 28-byte one) to one recipient
   through ``Relay.send``; the recipient fetches and acknowledges every one, so each is archived in
   its history by the acknowledge script. ``MEMORY USAGE key SAMPLES 0`` (every stream node counted)
   of the history stream (and of the positions hash), divided by the envelopes archived.
2. The store: STORED envelopes among 20 agents (each sends to the 19 others in turn), in rounds of
   ``ROUND`` sends (in one pipeline of ``send.lua``: ``Pipelined``; with ``--through-relay``, through
   ``Relay.send`` at once), then every recipient's ``Relay.fetch`` and ``Relay.ack`` at once. Nine in
   ten are acknowledged (archived); the last tenth stays queued. ``history_fill_s`` is its time;
   ``lost`` = sent but neither acknowledged nor queued at the end, ``duplicated`` = handed out twice.
3. Thread read: a thread of 6 between two agents sent in the middle of the store (four envelopes
   acknowledged, two still queued), read through ``RedisOperatorView.thread`` (what ``relay thread``
   and the dashboard call), 50 reads: p50 and p99.
4. Search over a day: the last 100,000 archived envelopes (``DAY``) left their inboxes after a moment
   ``since``; one in 1,000 of them holds the words ``nightly deploy``. ``relay search nightly deploy
   --since <since>``'s calls (``IOperatorView.history`` of every registered agent, in turn) and an
   agent's ``SearchAgentMessages {query: "nightly deploy", since}`` (the tool's ``run`` in-process,
   over the same view), 20 searches each: p50, p99 and history entries read.
5. ``core_ratio_history``: envelopes per second through send, fetch and acknowledge (64 at a time)
   with history on (30 days) over off (0), in alternated rounds of the same duration, one pair after
   the other in one window: the median of the per-pair ratios.

The last line of the script starts with ``history-bench``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings, driver
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.inbox import retained_until
from adapters.redis.operator_view import RedisOperatorView
from adapters.redis.pipeline import pack
from adapters.redis.protocol import DAY_MS, SendAppended, send_call
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import format_ms, now_ms
from broker.front.mail_tool import SearchAgentMessages
from broker.front.tokens import AgentIdentity
from broker.ids import new_nonce
from broker.limits import MAX_FETCH_LIMIT
from broker.ports import HistoryQuery, SendOptions
from broker.relay import Relay

ADDRESS = ClaudeCodeAddress.parse("127.0.0.1:14111")
AGENTS = 20
ROUND = 2000
"""Sends at once while filling the store (100 per recipient: one fetch of each inbox takes them all)."""
DAY = 100_000
"""Archived envelopes the search's time range holds."""
NEEDLE = 1000
"""One envelope in ``NEEDLE`` of the day holds the searched words."""
WORDS = ("nightly", "deploy")
HISTORY_ON_MS = 30 * 24 * 3600 * 1000
BYTES_COUNT = 20_000
READS = 50
SEARCHES = 20


def relay_on(
    url: str, prefix: str, retention_ms: int = HISTORY_ON_MS
) -> tuple[Relay[AgentMessage], RedisConnection]:
    settings = RedisSettings(url=url, prefix=prefix, history_retention_ms=retention_ms)
    connection = RedisConnection(settings)
    return Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection)), connection


def p50_p99(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[max(0, round(len(ordered) * 0.99 + 0.5) - 1)]


async def archived_bytes(url: str, prefix: str, n: int, text: str) -> tuple[float, float]:
    """(history stream, history positions hash) bytes per archived envelope."""
    relay, connection = relay_on(url, prefix)
    async with relay:
        for agent in ("boss", "worker"):
            await relay.register(agent, ADDRESS, f"{agent}-1")
        body = AgentMessage(kind=Kind.KIND_REQUEST, text=text)
        for start in range(0, n, MAX_FETCH_LIMIT):
            count = min(MAX_FETCH_LIMIT, n - start)
            await asyncio.gather(*(relay.send("boss", "worker", body) for _ in range(count)))
            got = await relay.fetch("worker", MAX_FETCH_LIMIT)
            await relay.ack("worker", [e.id for e in got])
        keys = connection.keys
    client = Redis.from_url(url)
    try:
        kept = int(await client.memory_usage(keys.history("worker"), samples=0) or 0)
        at = int(await client.memory_usage(keys.history_positions("worker"), samples=0) or 0)
        return kept / n, at / n
    finally:
        await client.aclose()


@dataclass
class Store:
    """A filled store: what was counted, and what the reads need."""

    agents: list[str]
    sent: int = 0
    acknowledged: int = 0
    duplicated: int = 0
    queued: int = 0
    seconds: float = 0.0
    since_ms: int = 0
    """The store's clock before the day's first acknowledgement: the search range starts here."""
    day: int = 0
    """Envelopes acknowledged since ``since_ms``: what the search's range holds."""
    thread: list[str] = field(default_factory=list)
    """The thread of 6's envelope ids, its root first."""

    @property
    def lost(self) -> int:
        return self.sent - self.acknowledged - self.queued


def filler(i: int) -> AgentMessage:
    text = f"status {i}: the build of module {i % 97} passed its checks and the report is attached"
    if i % NEEDLE == NEEDLE // 2:
        text = f"status {i}: the nightly deploy of module {i % 97} is done"
    return AgentMessage(kind=Kind.KIND_NOTE, text=text)


class Pipelined:
    """Sends as ``RedisInboxStore.append`` makes them on one Redis (``send.lua``, the call
    ``send_call(...).combined()`` builds, the same nonce, day and retentions), ``ROUND`` at a time in
    one pipeline of ``FCALL`` on one connection, packed and written as the auto-pipeline does
    (``pipeline.pack``, ``driver.write``): the product's script and codec, without the per-call cost
    of the relay and of the auto-pipeline's batches of 8. Each reply is read by ``SendAppended.read``;
    a refusal fails the fill."""

    def __init__(self, relay: Relay[AgentMessage], connection: RedisConnection, url: str) -> None:
        self.relay, self.connection = relay, connection
        self.client = Redis.from_url(url, decode_responses=True)
        self.script = connection.scripts.send
        store = relay._inbox  # the bench builds the calls of the store it fills
        assert isinstance(store, RedisInboxStore)
        self.store = store
        self.loaded = False

    async def send(self, pairs: list[tuple[str, str, AgentMessage]]) -> int:
        settings, keys = self.connection.settings, self.connection.keys
        if not self.loaded:  # send.lua is one Redis's whole send (a cluster takes two steps)
            assert self.connection.single_node
            library = self.connection.scripts.library
            self.loaded = await self.client.function_load(library.source, replace=True) == library.name
        commands: list[tuple[str | int, ...]] = []
        for sender, to, body in pairs:
            sent_at_ms = now_ms()
            day = sent_at_ms // DAY_MS
            call = send_call(
                keys,
                settings,
                sender,
                to,
                self.relay.contract.to_fields(body),
                sent_at_ms=sent_at_ms,
                session=None,
                options=SendOptions(),
                nonce=new_nonce(),
                day=day,
                index_until=retained_until(day, settings.status_retention_ms),
                replies_until=self.store._replies_until,
            ).combined()
            commands.append(("FCALL", self.script.function, len(call.keys), *call.keys, *call.args))
        pool = self.client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:  # packed and written as the auto-pipeline does (a refusal raises its ResponseError)
            await driver.write(connection, pack(commands))
            replies = [await driver.read(connection) for _ in commands]
        finally:
            await pool.release(connection)
        return sum(1 for reply in replies if SendAppended.read(reply).stream_id)

    async def close(self) -> None:
        await self.client.aclose()


async def fill(
    relay: Relay[AgentMessage], view: RedisOperatorView, stored: int, pipelined: Pipelined | None
) -> Store:
    """``stored`` envelopes among ``AGENTS`` agents; nine in ten acknowledged, the rest queued. Sent
    through ``relay.send`` (concurrently: the auto-pipeline carries them), or ``pipelined``; fetched
    and acknowledged through ``relay.fetch`` and ``relay.ack``, every inbox at once."""
    store = Store([f"agent-{i:02d}" for i in range(AGENTS)])
    agents = store.agents
    for agent in agents:
        await relay.register(agent, ADDRESS, f"{agent}-1")
    archived = stored - stored // 10
    day_starts, day_from = max(0, archived - DAY), 0
    began = time.perf_counter()

    def pair(i: int) -> tuple[str, str, AgentMessage]:
        k = i % AGENTS
        return agents[k], agents[(k + 1 + (i // AGENTS) % (AGENTS - 1)) % AGENTS], filler(i)

    async def one_round(first: int, count: int, take: bool) -> None:
        sends = [pair(i) for i in range(first, first + count)]
        if pipelined is not None:
            store.sent += await pipelined.send(sends)
        else:
            store.sent += len(await asyncio.gather(*(relay.send(*one) for one in sends)))
        if take:
            got = await asyncio.gather(*(relay.fetch(a, MAX_FETCH_LIMIT) for a in agents))
            done = await asyncio.gather(
                *(relay.ack(a, [e.id for e in g]) for a, g in zip(agents, got, strict=True) if g)
            )
            store.duplicated += sum(1 for g in got for e in g if e.deliveries > 1)
            store.acknowledged += sum(len(d.acknowledged) for d in done)

    at = 0
    while at < stored:
        if at <= archived // 2 < at + ROUND and not store.thread:
            await thread_hops(relay, store, range(4), take=True)  # in the middle of the archived
        if at == archived:
            await thread_hops(relay, store, range(4, 6), take=False)  # the thread's end stays queued
        if at <= day_starts < at + ROUND:
            store.since_ms, day_from = await view.now_ms(), store.acknowledged
        count = min(ROUND, (archived if at < archived else stored) - at)
        await one_round(at, count, take=at < archived)
        at += count
    store.day = store.acknowledged - day_from
    store.queued = sum(o.inbox_depth for o in (await view.agents(AGENTS + 1)).agents)
    store.seconds = time.perf_counter() - began
    return store


async def thread_hops(relay: Relay[AgentMessage], store: Store, hops: range, *, take: bool) -> None:
    """Envelopes ``hops`` of a thread of 6 between the first two agents: a request, then replies back
    and forth; with ``take`` each is fetched and acknowledged (archived) at once, else it stays queued."""
    a, b = store.agents[0], store.agents[1]
    for hop in hops:
        frm, to = (a, b) if hop % 2 == 0 else (b, a)
        body = (
            AgentMessage(kind=Kind.KIND_REQUEST, text="which tests fail on main?")
            if not store.thread
            else AgentMessage(kind=Kind.KIND_REPLY, text=f"answer {hop}", in_reply_to=store.thread[-1])
        )
        store.thread.append((await relay.send(frm, to, body)).id)
        store.sent += 1
        if take:
            got = await relay.fetch(to, MAX_FETCH_LIMIT)
            store.acknowledged += len((await relay.ack(to, [e.id for e in got])).acknowledged)


async def thread_read(view: RedisOperatorView, store: Store) -> list[float]:
    times = []
    for _ in range(READS):
        began = time.perf_counter()
        found = await view.thread(store.thread[0])
        times.append((time.perf_counter() - began) * 1000)
        if sorted(e.envelope_id for e in found) != sorted(store.thread):
            raise AssertionError(f"thread read found {len(found)} envelopes, not the thread of 6")
    return times


async def operator_search(
    view: RedisOperatorView, agents: list[str], since_ms: int
) -> tuple[float, int, int]:
    """``relay search nightly deploy --since <since>``'s calls: (ms, entries found, entries read)."""
    query = HistoryQuery(since_ms=since_ms, words=WORDS)
    began = time.perf_counter()
    pages = [await view.history(a, query, 100) for a in agents]
    took = (time.perf_counter() - began) * 1000
    return took, sum(len(p.entries) for p in pages), sum(p.read for p in pages)


async def search_day(relay: Relay[AgentMessage], view: RedisOperatorView, store: Store) -> dict[str, float]:
    operator, agent = [], []
    found = read = 0
    tool = SearchAgentMessages(relay, view)
    who = AgentIdentity(store.agents[2], f"{store.agents[2]}-1", expires_at=2**40)
    arguments = {"query": " ".join(WORDS), "since": format_ms(store.since_ms)}
    mine = 0
    for _ in range(SEARCHES):
        took, found, read = await operator_search(view, store.agents, store.since_ms)
        operator.append(took)
        began = time.perf_counter()
        result = await tool.run(who, arguments)
        agent.append((time.perf_counter() - began) * 1000)
        if result.is_error or not isinstance(result.structured_content, dict):
            raise AssertionError(f"SearchAgentMessages failed: {result.content}")
        mine = len(result.structured_content["messages"])
    (o50, o99), (a50, a99) = p50_p99(operator), p50_p99(agent)
    return {
        "search_day_p50_ms": round(o50, 1),
        "search_day_p99_ms": round(o99, 1),
        "search_day_envelopes": store.day,
        "search_day_found": found,
        "search_day_read": read,
        "search_agent_day_p50_ms": round(a50, 1),
        "search_agent_day_p99_ms": round(a99, 1),
        "search_agent_day_found": mine,
    }


@dataclass
class Cycles:
    sent: int = 0
    acknowledged: int = 0
    duplicated: int = 0


async def cycle_rate(url: str, prefix: str, duration: float, retention_ms: int, counts: Cycles) -> float:
    """Envelopes per second through send, fetch and acknowledge (64 at a time) for ``duration``
    seconds with the given history retention; everything sent is taken back before it returns."""
    relay, _ = relay_on(url, prefix, retention_ms)
    body = AgentMessage(kind=Kind.KIND_NOTE, text="x" * 300)
    done = 0
    async with relay:
        for agent in ("boss", "worker"):
            await relay.register(agent, ADDRESS, f"{agent}-1")
        began = time.perf_counter()
        while time.perf_counter() - began < duration:
            await asyncio.gather(*(relay.send("boss", "worker", body) for _ in range(64)))
            counts.sent += 64
            got = await relay.fetch("worker", 64)
            acked = await relay.ack("worker", [e.id for e in got])
            counts.duplicated += sum(1 for e in got if e.deliveries > 1)
            counts.acknowledged += len(acked.acknowledged)
            done += len(acked.acknowledged)
        elapsed = time.perf_counter() - began
        for _ in range(100):  # what the last fetch left (none when every send landed)
            got = await relay.fetch("worker", MAX_FETCH_LIMIT)
            if not got:
                break
            counts.acknowledged += len((await relay.ack("worker", [e.id for e in got])).acknowledged)
    return done / elapsed


async def history_figures(
    url: str,
    stored: int,
    rounds: int = 3,
    duration: float = 2.0,
    *,
    through_relay: bool = False,
    bytes_count: int = BYTES_COUNT,
    tag: str = "h",
) -> dict[str, Any]:
    """The part's figures; ``history_lost`` and ``history_duplicated`` count every envelope it sent.
    The store's sends go in pipelines of ``send.lua`` (``Pipelined``), or with ``through_relay``
    through ``Relay.send``. ``tag`` starts every key prefix the part uses."""
    long, at = await archived_bytes(url, f"{tag}b", bytes_count, "x" * 300)
    short, _ = await archived_bytes(url, f"{tag}s", bytes_count, "please run the nightly build")
    relay, connection = relay_on(url, f"{tag}store")
    view = RedisOperatorView(connection)
    async with relay:
        await view.open()
        try:
            pipelined = None if through_relay else Pipelined(relay, connection, url)
            try:
                store = await fill(relay, view, stored, pipelined)
            finally:
                if pipelined is not None:
                    await pipelined.close()
            reads = await thread_read(view, store)
            search = await search_day(relay, view, store)
        finally:
            await view.close()
    cycles = Cycles()
    pairs = []
    for round_ in range(rounds):  # on, off, on, off...: each pair back to back (the machine is shared)
        on = await cycle_rate(url, f"{tag}con{round_}", duration, HISTORY_ON_MS, cycles)
        off = await cycle_rate(url, f"{tag}coff{round_}", duration, 0, cycles)
        pairs.append((on, off))
    p50, p99 = p50_p99(reads)
    return {
        "history_stored": stored,
        "history_fill_s": round(store.seconds, 1),
        "history_fill": "relay" if through_relay else "pipelined",
        "thread_read_p50_ms": round(p50, 2),
        "thread_read_p99_ms": round(p99, 2),
        **search,
        "history_bytes_per_envelope": round(long),
        "history_bytes_per_envelope_text28": round(short),
        "history_positions_bytes_per_envelope": round(at),
        "core_ratio_history": round(statistics.median(on / off for on, off in pairs), 3),
        "history_on_msgs_per_s": round(statistics.median(on for on, _ in pairs)),
        "history_off_msgs_per_s": round(statistics.median(off for _, off in pairs)),
        "history_lost": store.lost + cycles.sent - cycles.acknowledged,
        "history_duplicated": store.duplicated + cycles.duplicated,
    }


def describe(figures: dict[str, Any]) -> str:
    f = figures
    return (
        f"history: {f['history_stored']:,} stored (9/10 archived, 20 agents) filled in "
        f"{f['history_fill_s']} s ({f['history_fill']} sends); thread of 6 read p50 "
        f"{f['thread_read_p50_ms']} ms, p99 {f['thread_read_p99_ms']} ms; search of a day of "
        f"{f['search_day_envelopes']:,}: relay search p50 "
        f"{f['search_day_p50_ms']} ms p99 {f['search_day_p99_ms']} ms ({f['search_day_read']} entries read), "
        f"SearchAgentMessages p50 {f['search_agent_day_p50_ms']} ms p99 {f['search_agent_day_p99_ms']} ms; "
        f"{f['history_bytes_per_envelope']} B per archived envelope (300-byte text); core rate history "
        f"on/off {f['core_ratio_history']}"
    )


async def main() -> int:
    through_relay = "--through-relay" in sys.argv
    given = [a for a in sys.argv[1:] if a != "--through-relay"]
    stored = int(given[0]) if given else 1_000_000
    server = EmbeddedRedis()
    server.start()
    try:
        figures = await history_figures(server.url, stored, through_relay=through_relay)
    finally:
        server.stop()
    print(describe(figures))
    print("history-bench " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 1 if figures["history_lost"] or figures["history_duplicated"] else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
