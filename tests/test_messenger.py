"""At-least-once delivery beyond the conformance suite: a receiving process killed mid-delivery, a
handler failing k times, dead letters, and two receive loops under load, on both backends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.addresses import WorkbenchAddress
from broker.delivery import DeliverySettings
from broker.envelope import Envelope, Tier
from broker.messenger import Handler, Messenger
from broker.testing.polling import eventually
from tests.messenger_support import memory_messengers, redis_messengers
from tests.support import Text, TextContract, unique_prefix

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "workers" / "receiver.py"
FAST = DeliverySettings(max_attempts=4, visibility=30.0, backoff_base=0.01, backoff_cap=0.04, poll=0.2)
BOUND = 20.0

BACKENDS = ["memory", "redis"]


@contextlib.asynccontextmanager
async def messengers(
    backend: str, request: pytest.FixtureRequest, count: int, settings: DeliverySettings
) -> AsyncIterator[list[Messenger[Text]]]:
    if backend == "memory":
        async with memory_messengers(TextContract(), count, settings) as made:
            yield made
    else:
        url = request.getfixturevalue("redis_url")
        async with redis_messengers(TextContract(), url, count, settings) as made:
            yield made


async def register(messenger: Messenger[Text], *agents: str) -> None:
    for agent in agents:
        await messenger.register(agent, WorkbenchAddress.parse(f"wb-{agent}"), f"s-{agent}")


def dead_letters_metric(messenger: Messenger[Text]) -> float:
    found = messenger.relay.metrics.registry.get_sample_value(
        "csf_relay_dead_letters_total", {"tier": Tier.IN_PROCESS.label}
    )
    return 0.0 if found is None else found


async def serve_until(
    messenger: Messenger[Text], agent: str, handler: Handler[Text], done: asyncio.Event, bound: float = BOUND
) -> None:
    """Serve until ``done`` is set (by the handler or the test), failing the test after ``bound``."""
    await asyncio.wait_for(messenger.serve(agent, handler, stop=done), bound)


# -- a receiving process killed with SIGKILL mid-delivery ---------------------------------------------


async def test_envelopes_of_a_killed_process_are_delivered_by_another(redis_url: str) -> None:
    prefix = unique_prefix()
    reclaiming = DeliverySettings(visibility=0.5, poll=0.1, backoff_base=0.01, backoff_cap=0.04)
    async with redis_messengers(TextContract(), redis_url, 1, reclaiming, prefix=prefix) as (messenger,):
        await register(messenger, "alice", "bob")
        sent = [await messenger.send("alice", "bob", Text(f"m{i}")) for i in range(3)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), redis_url, prefix, "bob", cwd=ROOT, env=env,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert child.stdout is not None
            line = (await asyncio.wait_for(child.stdout.readline(), BOUND)).decode()
            assert line.split() == ["holding", sent[0].id, "1"], line
        finally:
            os.kill(child.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            await asyncio.wait_for(child.wait(), BOUND)
        assert child.returncode == -signal.SIGKILL

        # the child claimed all three (one in its handler, two waiting): all come back, once each
        got: list[Envelope[Text]] = []
        latency = 0.0
        async with messenger.receive("bob", wait=BOUND) as deliveries:
            async for delivery in deliveries:
                if not got:
                    latency = time.monotonic() - killed_at
                got.append(delivery.envelope)
                assert delivery.attempt == 2  # the store's delivery count survived the process
                assert await delivery.ack() is True
                if len(got) == len(sent):
                    break
        assert [e.id for e in got] == [e.id for e in sent]
        assert [e.message for e in got] == [Text("m0"), Text("m1"), Text("m2")]
        print(f"\nredelivery latency after SIGKILL: {latency * 1000:.0f} ms (visibility timeout 500 ms)")

        # acknowledged: never again, not even to a claim that takes over anything idle at all
        assert await messenger.queue.claim("bob", "bob@probe", 16, visibility=0.001, wait=0.3) == []
        async with messenger.receive("bob", wait=1.0) as deliveries:
            assert [d async for d in deliveries] == []


# -- handler failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_failing_k_times_then_succeeding_delivers_exactly_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    k = 2
    async with messengers(backend, request, 1, FAST) as (messenger,):
        await register(messenger, "alice", "bob")
        sent = await messenger.send("alice", "bob", Text("hello"))
        attempts: list[int] = []
        succeeded: list[str] = []
        done = asyncio.Event()

        async def submit(envelope: Envelope[Text]) -> None:
            attempts.append(envelope.deliveries)
            if len(attempts) <= k:
                raise ConnectionError("prompt queue unavailable")
            succeeded.append(envelope.id)
            done.set()

        await serve_until(messenger, "bob", submit, done)
        assert attempts == [1, 2, 3]
        assert succeeded == [sent.id]
        async with messenger.receive("bob", wait=0.3) as deliveries:
            assert [d async for d in deliveries] == []
        assert await messenger.dead_letter_count("bob") == 0
        assert dead_letters_metric(messenger) == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_always_failing_is_dead_lettered_counted_and_requeued(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with messengers(backend, request, 1, FAST) as (messenger,):
        await register(messenger, "alice", "bob")
        sent = await messenger.send("alice", "bob", Text("doomed"))
        attempts: list[int] = []
        stop = asyncio.Event()

        async def broken(envelope: Envelope[Text]) -> None:
            attempts.append(envelope.deliveries)
            raise ConnectionError("prompt queue unavailable")

        serving = asyncio.create_task(messenger.serve("bob", broken, stop=stop))
        try:
            await eventually(lambda: dead_letters_metric(messenger) >= 1, BOUND, "a dead letter counted")
        finally:
            stop.set()
            await asyncio.wait_for(serving, BOUND)
        assert attempts == [1, 2, 3, 4]
        assert dead_letters_metric(messenger) == 1
        (letter,) = await messenger.dead_letters("bob")
        assert (letter.envelope_id, letter.attempts) == (sent.id, FAST.max_attempts)
        assert letter.reason == "ConnectionError: prompt queue unavailable"

        (again,) = await messenger.requeue("bob")
        assert await messenger.dead_letter_count("bob") == 0
        done = asyncio.Event()
        received: list[Envelope[Text]] = []

        async def works(envelope: Envelope[Text]) -> None:
            received.append(envelope)
            done.set()

        await serve_until(messenger, "bob", works, done)
        assert [(e.id, e.message, e.sender, e.deliveries) for e in received] == [
            (again, Text("doomed"), "alice", 1)
        ]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_dead_letter_tells_a_handler_overrun_from_a_timeout_the_handler_reported(
    backend: str, request: pytest.FixtureRequest
) -> None:
    once = DeliverySettings(max_attempts=1, visibility=30.0, poll=0.2, handler_timeout=0.05)
    async with messengers(backend, request, 1, once) as (messenger,):
        await register(messenger, "alice", "slow", "waits")
        await messenger.send("alice", "slow", Text("never answered"))
        await messenger.send("alice", "waits", Text("answered with a timeout"))
        stop = asyncio.Event()

        async def overruns(envelope: Envelope[Text]) -> None:
            await stop.wait()

        async def reports(envelope: Envelope[Text]) -> None:
            raise TimeoutError("the session has not taken the prompt in")

        serving = [
            asyncio.create_task(messenger.serve("slow", overruns, stop=stop)),
            asyncio.create_task(messenger.serve("waits", reports, stop=stop)),
        ]
        try:
            await eventually(lambda: dead_letters_metric(messenger) >= 2, BOUND, "two dead letters")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*serving), BOUND)
        (slow,) = await messenger.dead_letters("slow")
        (waits,) = await messenger.dead_letters("waits")
        assert slow.reason == "TimeoutError: the handler ran longer than the handler timeout"
        assert waits.reason == "TimeoutError: the session has not taken the prompt in"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_envelopes_over_the_attempt_limit_are_dead_lettered_unhandled(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A poison envelope that kills every loop handling it: each death counts a delivery."""
    dying = DeliverySettings(max_attempts=2, visibility=0.2, backoff_base=0.01, backoff_cap=0.02, poll=0.05)
    async with messengers(backend, request, 1, dying) as (messenger,):
        await register(messenger, "alice", "bob")
        sent = await messenger.send("alice", "bob", Text("poison"))
        for attempt in (1, 2):
            loop = messenger.receive("bob", wait=BOUND)  # never closed: the loop "dies" holding it
            delivery = await asyncio.wait_for(anext(loop), BOUND)
            assert (delivery.envelope.id, delivery.attempt) == (sent.id, attempt)
        async with messenger.receive("bob", wait=1.0) as deliveries:
            assert [d async for d in deliveries] == []
        (letter,) = await messenger.dead_letters("bob")
        assert letter.attempts == 3 and "without an acknowledgement" in letter.reason
        assert dead_letters_metric(messenger) == 1


# -- two receive loops under load --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_loops_under_load_submit_every_envelope_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    per_sender, senders = 500, 2
    total = per_sender * senders
    async with messengers(backend, request, 2, FAST) as (one, two):
        await register(one, "alice", "carol", "bob")
        submitted: Counter[str] = Counter()
        by_loop: Counter[int] = Counter()
        failed_once: set[str] = set()
        done = asyncio.Event()

        def handler(loop: int) -> Handler[Text]:
            async def submit(envelope: Envelope[Text]) -> None:
                # every 10th envelope fails its first attempt, so retries run under load too
                if envelope.message.value.endswith("7") and envelope.id not in failed_once:
                    failed_once.add(envelope.id)
                    raise ConnectionError("transient")
                submitted[envelope.id] += 1
                by_loop[loop] += 1
                if sum(submitted.values()) >= total:
                    done.set()

            return submit

        loops = [
            asyncio.create_task(serve_until(m, "bob", handler(i), done, 120))
            for i, m in enumerate((one, two))
        ]

        async def burst(messenger: Messenger[Text], sender: str) -> list[str]:
            return [
                (await messenger.send(sender, "bob", Text(f"{sender} {n}"))).id for n in range(per_sender)
            ]

        started = time.monotonic()
        sent = [i for ids in await asyncio.gather(burst(one, "alice"), burst(two, "carol")) for i in ids]
        await asyncio.wait_for(asyncio.gather(*loops), 120)
        elapsed = time.monotonic() - started
        assert len(set(sent)) == total
        assert set(submitted) == set(sent)
        assert set(submitted.values()) == {1}
        assert len(failed_once) == total // 10
        assert by_loop[0] > 0 and by_loop[1] > 0
        print(f"\n{backend}: {total} envelopes through two loops in {elapsed:.2f} s ({dict(by_loop)})")

        # all acknowledged: nothing comes back to anyone, even taking over anything idle
        assert await one.queue.claim("bob", "bob@probe", 256, visibility=0.001) == []
        assert await one.relay.fetch("bob", 256) == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_requeue_finds_ids_anywhere_in_a_long_dead_letter_list(
    backend: str, request: pytest.FixtureRequest
) -> None:
    count = 300  # more than one 256-entry page of the requeue script's scan
    async with messengers(backend, request, 1, FAST) as (messenger,):
        await register(messenger, "alice", "bob")
        sent = [(await messenger.send("alice", "bob", Text(f"m{i}"))).id for i in range(count)]
        queue = messenger.queue
        claimed = await queue.claim("bob", "bob@test", 256, visibility=30.0)
        claimed += await queue.claim("bob", "bob@test", 256, visibility=30.0)
        assert [c.envelope_id for c in claimed] == sent
        for envelope_id in sent:
            assert await queue.dead_letter("bob", envelope_id, "test", consumer="bob@test")
        assert not await queue.dead_letter("bob", sent[0], "again")
        assert await messenger.dead_letter_count("bob") == count
        assert [x.envelope_id for x in await messenger.dead_letters("bob", 5)] == sent[:5]

        picked = [sent[299], sent[3], sent[270]]
        again = await messenger.requeue("bob", picked)
        assert len(again) == 3 and await messenger.dead_letter_count("bob") == count - 3
        rest = await messenger.requeue("bob")
        assert len(rest) == count - 3 and await messenger.dead_letter_count("bob") == 0
        texts: list[str] = []
        async with messenger.receive("bob", limit=256, wait=0.5) as deliveries:
            async for delivery in deliveries:
                texts.append(delivery.envelope.message.value)
                assert await delivery.ack()
        # requeued in dead-letter order: the picked ones first (oldest dead first), then the rest
        assert texts[:3] == ["m3", "m270", "m299"]
        assert sorted(texts) == sorted(f"m{i}" for i in range(count))
