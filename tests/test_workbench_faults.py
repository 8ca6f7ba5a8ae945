"""Workbench faults with the real SDKs, offline: a session process SIGKILLed while a prompt is being
submitted or before its model answered it, a session that keeps refusing, and the Workbench host
SIGKILLed with envelopes in flight.

- The session's CLI runs at a CPU priority 10 below the host's. It is stopped (SIGSTOP), so the
  submission of the next envelope hangs in it; once the store shows the envelope handed out, the CLI
  is SIGKILLed. The host restarts the session, resuming its conversation, and the envelope is
  delivered again (attempt 2) and acknowledged.
- The fake model holds the request of the next prompt (the session took it in, its model has not
  answered): the envelope is not acknowledged; the CLI is SIGKILLed, and the restarted session gets
  the envelope again (attempt 2).
- A model that holds its answer beyond the submission's wait: the prompt, taken in long enough
  before, is accepted then (attempt 1), not failed.
- A session with ``max_queued = 0`` in a turn that does not end refuses every prompt: after
  ``max_attempts`` the envelope is a dead letter, with the refusal as its reason.
- ``relay workbench`` (a child process) is SIGKILLed while its sessions hold prompts they have not
  taken in; its CLIs exit by themselves, and after a restart every envelope reaches its model and is
  acknowledged: none is lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessage, AgentMessageContract, Kind
from broker.envelope import Envelope
from broker.relay import Relay
from broker.testing.polling import eventually
from tests.claude_code import descendants, stop_tree
from tests.fake_anthropic import FakeAnthropic
from tests.fake_model import FakeModelAPI
from tests.fake_openai import FakeOpenAI
from tests.front_support import running_front
from tests.support import unique_prefix
from tests.workbench_support import (
    Hosted,
    WorkbenchProcess,
    claude_agent_entry,
    claude_agent_fixture,
    cli_environment_fixture,
    copilot_agent_entry,
    copilot_cli_fixture,
    hosting,
    request_where,
    write_config,
)

__all__ = ["claude_agent_fixture", "cli_environment_fixture", "copilot_cli_fixture"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BOUND = 90.0
RUNTIMES = ["copilot", "claude-agent"]


async def _state(relay: Relay[AgentMessage], sender: str, envelope_id: str) -> str:
    (status,) = await relay.status(sender, [envelope_id])
    return status.state


async def _until_state(relay: Relay[AgentMessage], sender: str, envelope_id: str, *states: str) -> None:
    async def reached() -> bool:
        return await _state(relay, sender, envelope_id) in states

    await eventually(reached, BOUND, f"{envelope_id} {' or '.join(states)}")


def _note(text: str) -> AgentMessage:
    return AgentMessage(kind=Kind.KIND_NOTE, text=text)


@contextlib.asynccontextmanager
async def _hosted_solo(
    runtime: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, **delivery: Any
) -> AsyncIterator[tuple[Relay[AgentMessage], FakeModelAPI, Hosted]]:
    """Agent ``solo``, one session of ``runtime`` at its fake model API, hosted beside a front on a
    prefix of its own: the front's relay, the API and the host."""
    if runtime == "copilot":
        cli = request.getfixturevalue("copilot_cli")
        request.getfixturevalue("cli_environment")
        api: FakeModelAPI = FakeOpenAI()
    else:
        request.getfixturevalue("claude_agent")
        request.getfixturevalue("cli_environment")
        api = FakeAnthropic()
    prefix = unique_prefix()
    with api:
        entry = (
            copilot_agent_entry("solo", api.base_url, cli)
            if runtime == "copilot"
            else claude_agent_entry("solo", api.base_url)
        )
        config = write_config(tmp_path / "workbench.toml", [entry], **delivery)
        async with (
            running_front(redis_url, prefix=prefix) as front,
            hosting(config, redis_url, prefix, tmp_path / "data", 1) as hosted,
        ):
            yield front.relay, api, hosted


async def _first_turn(
    relay: Relay[AgentMessage], api: FakeModelAPI, hosted: Hosted
) -> Envelope[AgentMessage]:
    """``cc`` registers and sends ``solo`` a first note; once its turn has ended, the session has a
    conversation to resume (the CLI stores a turn as it ends: a kill before that leaves none)."""
    await relay.register("cc", _host_address(), "cc-1")
    first = await relay.send("cc", "solo", _note("remember the word marmalade"), session="cc-1")
    await request_where(api, lambda r: first.id in r.text(), "with the first note")
    await _until_state(relay, "cc", first.id, "acknowledged")
    live = hosted.sessions.live("workbench.solo")
    await eventually(lambda: live is not None and not live.busy, BOUND, "the first turn ended")
    return first


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_session_killed_mid_submission_is_restarted_and_gets_the_envelope_again(
    runtime: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
) -> None:
    async with _hosted_solo(runtime, request, tmp_path, redis_url) as (relay, api, hosted):
        first = await _first_turn(relay, api, hosted)
        pid = hosted.pid("solo")
        # the CLI runs below the host's CPU priority: the host's loop, which every delivery waits
        # on, gets a core first
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        os.kill(pid, signal.SIGSTOP)
        try:
            second = await relay.send("cc", "solo", _note("and now the second note"), session="cc-1")
            await _until_state(relay, "cc", second.id, "delivered")  # handed to the hung submission
        finally:
            os.kill(pid, signal.SIGKILL)
        again = await request_where(api, lambda r: second.id in r.text(), "with the second note")
        await _until_state(relay, "cc", second.id, "acknowledged")
        assert f"message {second.id} for solo" in again.text() and "attempt: 2\n" in again.text()
        assert "remember the word marmalade" in again.text()  # the conversation was resumed
        assert hosted.pid("solo") != pid
        statuses = await relay.status("cc", [first.id, second.id])
        assert [s.state for s in statuses] == ["acknowledged", "acknowledged"]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_session_killed_before_its_model_answered_a_prompt_it_took_in_gets_the_envelope_again(
    runtime: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
) -> None:
    """A session takes a prompt into its conversation a moment before its model request leaves, and
    a CLI killed then keeps nothing of it: the envelope is acknowledged only once the model answered."""
    async with _hosted_solo(runtime, request, tmp_path, redis_url) as (relay, api, hosted):
        first = await _first_turn(relay, api, hosted)
        pid = hosted.pid("solo")
        api.hold()  # the model gets the next request and does not answer it
        try:
            second = await relay.send("cc", "solo", _note("and now the second note"), session="cc-1")
            await request_where(api, lambda r: second.id in r.text(), "with the second note")
            assert await _state(relay, "cc", second.id) == "delivered"  # taken in, not answered
            os.kill(pid, signal.SIGKILL)
        finally:
            api.release()
        again = await request_where(
            api,
            lambda r: second.id in r.text() and "attempt: 2\n" in r.text(),
            "with the second note again",
        )
        await _until_state(relay, "cc", second.id, "acknowledged")
        assert "remember the word marmalade" in again.text()  # the conversation was resumed
        assert hosted.pid("solo") != pid
        statuses = await relay.status("cc", [first.id, second.id])
        assert [s.deliveries for s in statuses] == [1, 2]


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_a_prompt_whose_model_is_slow_to_answer_is_acknowledged_once_its_request_has_long_left(
    runtime: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
) -> None:
    """A slow model must not fail the attempt (and at last dead-letter an envelope its session is
    working on): a prompt taken in long enough ago is accepted when the wait for its answer ends."""
    # visibility 8 s: the handler timeout is 4 s, a submission waits 3 s for the model's answer
    async with _hosted_solo(runtime, request, tmp_path, redis_url, visibility_seconds=8) as (relay, api, _):
        await relay.register("cc", _host_address(), "cc-1")
        api.hold()  # the model does not answer while the test runs
        try:
            sent = await relay.send("cc", "solo", _note("a long question"), session="cc-1")
            await request_where(api, lambda r: sent.id in r.text(), "with the note")
            await _until_state(relay, "cc", sent.id, "acknowledged", "dead_lettered")
            (status,) = await relay.status("cc", [sent.id])
            assert (status.state, status.deliveries) == ("acknowledged", 1), status
        finally:
            api.release()


async def test_a_session_that_keeps_refusing_ends_in_a_dead_letter_with_the_reason(
    claude_agent: None, cli_environment: dict[str, str], tmp_path: Path, redis_url: str
) -> None:
    prefix = unique_prefix()
    with FakeAnthropic() as api:
        entry = claude_agent_entry("solo", api.base_url, max_queued=0)
        config = write_config(tmp_path / "workbench.toml", [entry], max_attempts=3)
        api.hold()  # the first prompt's turn does not end: the session stays busy
        async with (
            running_front(redis_url, prefix=prefix) as front,
            hosting(config, redis_url, prefix, tmp_path / "data", 1),
        ):
            relay = front.relay
            await relay.register("cc", _host_address(), "cc-1")
            first = await relay.send("cc", "solo", _note("the long task"), session="cc-1")
            await request_where(api, lambda r: first.id in r.text(), "with the first note")
            second = await relay.send("cc", "solo", _note("one more thing"), session="cc-1")
            await _until_state(relay, "cc", second.id, "dead_lettered")
            (status,) = await relay.status("cc", [second.id])
            assert status.reason is not None and status.reason.startswith("SessionBusy: session "), status
            assert "max_queued 0" in status.reason and status.deliveries == 3
            api.release()
            await _until_state(relay, "cc", first.id, "acknowledged")
            assert not any(second.id in r.text() for r in api.requests)  # never queued in the session


async def test_the_host_killed_with_envelopes_in_flight_loses_none_after_a_restart(
    copilot_cli: Path, claude_agent: None, tmp_path: Path, redis_url: str
) -> None:
    suffix = str(time.monotonic_ns())[-6:]  # agent ids of their own on the shared test Redis
    planner, builder, cc = f"planner-{suffix}", f"builder-{suffix}", f"cc-{suffix}"
    with FakeOpenAI() as openai, FakeAnthropic() as anthropic:
        config = write_config(
            tmp_path / "workbench.toml",
            [
                copilot_agent_entry(planner, openai.base_url, copilot_cli),
                claude_agent_entry(builder, anthropic.base_url),
            ],
            visibility_seconds=2,
        )
        openai.hold()
        anthropic.hold()
        data_dir, log = tmp_path / "data", tmp_path / "workbench.log"
        async with _relay(redis_url) as relay:
            await relay.register(cc, _host_address(), "cc-1")
            first = WorkbenchProcess(config, redis_url, data_dir, log).start()
            try:
                await _until_registered(first, log)
                sent: list[Envelope[AgentMessage]] = []
                for n in range(4):
                    for agent in (planner, builder):
                        sent.append(
                            await relay.send(cc, agent, _note(f"task {n} for {agent}"), session="cc-1")
                        )
                for api, agent in ((openai, planner), (anthropic, builder)):
                    await request_where(
                        api, lambda r, a=agent: f"task 0 for {a}" in r.text(), f"{agent}'s first"
                    )
                states = [await _state(relay, cc, e.id) for e in sent]
                assert "delivered" in states or "queued" in states, states  # in flight: not all taken in
                clis = descendants(first.pid)
                os.kill(first.pid, signal.SIGKILL)
                first.proc.wait(30)  # type: ignore[union-attr]
                await _until_exited(clis)  # the sessions' CLIs end with their host
            finally:
                first.stop()
            openai.release()
            anthropic.release()
            second = WorkbenchProcess(config, redis_url, data_dir, log).start()
            try:
                for envelope in sent:
                    await _until_state(relay, cc, envelope.id, "acknowledged")
                for api, agent in ((openai, planner), (anthropic, builder)):
                    mine = [e for e in sent if e.to == agent]
                    for envelope in mine:
                        await request_where(
                            api, lambda r, i=envelope.id: i in r.text(), f"{agent} {envelope.id}"
                        )
                assert all(s.state == "acknowledged" for s in await relay.status(cc, [e.id for e in sent]))
            finally:
                second.stop()


@contextlib.asynccontextmanager
async def _relay(url: str) -> AsyncIterator[Relay[AgentMessage]]:
    """A relay on the store ``relay workbench --redis-url`` uses (the default key prefix)."""
    connection = RedisConnection(RedisSettings(url=url))
    async with Relay(AgentMessageContract(), RedisInboxStore(connection), RedisRegistry(connection)) as relay:
        yield relay


def _host_address() -> ClaudeCodeAddress:
    return ClaudeCodeAddress.parse("127.0.0.1:14111")


async def _until_registered(host: WorkbenchProcess, log: Path) -> None:
    def serving() -> bool:
        if host.proc is not None and host.proc.poll() is not None:
            raise AssertionError(f"relay workbench exited: {log.read_text()[-3000:]}")
        return "workbench serving" in log.read_text()  # logged once every agent is registered

    await eventually(serving, 120, "relay workbench registered its agents")


async def _until_exited(pids: list[int]) -> None:
    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() and _state_of(pid) != "Z" for pid in pids)

    try:
        await eventually(gone, 30, "the killed host's CLIs exited")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                stop_tree(pid, 2)


def _state_of(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return stat[stat.rindex(")") + 2]
