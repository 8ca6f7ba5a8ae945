"""A small host application: two Workbench agents and one Claude Code agent on one relay.

- ``planner`` and ``builder`` are in-process Workbench sessions. The host binds their
  ``register_agent`` / ``send_agent_message`` tools (``SessionMessaging.tools``) and implements
  ``PromptQueue``: each message to them arrives as a prompt in their session. A toy "model" per
  session reads the prompt and answers every request with a reply (kind 3, ``in_reply_to`` = the
  prompt's id).
- ``reviewer`` is a Claude Code session (host tier). Its side is simulated by calling ``relay.fetch``
  and ``relay.ack`` directly, exactly what its MCP tools (FetchAgentInbox / AcknowledgeAgentInbox) do.
- The builder's session is "busy" the first time a prompt is submitted: the relay retries it, the
  at-least-once delivery at work.

Run from the repository root: ``python -m examples.host_app`` (memory backend, no server needed) or
``python -m examples.host_app --redis-url redis://127.0.0.1:6379/0``. It ends by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import secrets
import sys
from collections.abc import AsyncIterator, Mapping

from adapters.memory import MemoryInboxStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.workbench import SessionMessaging, SessionTool
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import KIND_LABELS, AgentMessage, AgentMessageContract, Kind
from broker.delivery import DeliverySettings
from broker.messenger import Messenger
from broker.relay import Relay

SESSIONS = {"planner": "session-planner", "builder": "session-builder"}
REVIEWER_SESSION = "cc-reviewer-1"
EXPECTED_PROMPTS = 4  # planner: 2 (reply, status); builder: 2 (request, the reviewer's reply)
SETTINGS = DeliverySettings(max_attempts=5, visibility=10.0, backoff_base=0.05, backoff_cap=0.2, poll=0.2)


class ToySessions:
    """The host's ``PromptQueue``: one queue of prompts per session, worked by a toy model."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[str]] = {s: asyncio.Queue() for s in SESSIONS.values()}
        self.tools: dict[str, list[SessionTool]] = {}
        self.prompts = 0
        self.handled = 0
        self.busy_once = {"session-builder"}
        self.finished = asyncio.Event()

    async def submit(self, session: str, prompt: str) -> None:
        if session in self.busy_once:
            self.busy_once.discard(session)
            print(f"host: {session} is busy, prompt not queued (the relay will retry)")
            raise RuntimeError("session busy")
        await self.queues[session].put(prompt)

    async def work(self, agent: str, session: str) -> None:
        """The toy model of one session: print each prompt, answer requests, report progress."""
        while True:
            prompt = await self.queues[session].get()
            self.prompts += 1
            print(f"\n== prompt queued in {session} ==\n{prompt}\n== end of prompt ==")
            header = dict(re.findall(r"^(from|kind|id): (\S+)", prompt, flags=re.MULTILINE))
            if header["kind"] == "request":
                await self.say(agent, header["from"], Kind.KIND_REPLY, f"{agent}: done", header["id"])
                if agent == "builder":
                    await self.say(agent, "reviewer", Kind.KIND_REQUEST, "please review the parser")
            elif agent == "builder" and header["kind"] == "reply":
                await self.say(agent, "planner", Kind.KIND_STATUS, "parser built and reviewed")
            # counted once handled, not once received: the planner may read the status before the
            # builder's send returns, and the example must not stop while a session is still talking
            self.handled += 1
            if self.handled >= EXPECTED_PROMPTS:
                self.finished.set()

    async def say(self, agent: str, to: str, kind: int, text: str, in_reply_to: str | None = None) -> None:
        """Call the session's own ``send_agent_message`` tool, as its model would."""
        message: dict[str, object] = {"kind": kind, "text": text}
        if in_reply_to is not None:
            message["in_reply_to"] = in_reply_to
        (send,) = [t for t in self.tools[SESSIONS[agent]] if t.name == "send_agent_message"]
        result = await send.call({"to": to, "message": message})
        _show_sent(agent, to, kind, result)


def _show_sent(who: str, to: str, kind: int, result: Mapping[str, object]) -> None:
    if "error" in result:
        print(f"{who} -> {to}: refused {result['error']}")
    else:
        print(f"{who} -> {to}: {KIND_LABELS[kind]} {result['id']}")


async def reviewer(relay: Relay[AgentMessage], stop: asyncio.Event) -> None:
    """What a Claude Code session does through /mcp/agent: fetch, act, acknowledge."""
    while not stop.is_set():
        for envelope in await relay.fetch("reviewer", 16, wait=0.2, session=REVIEWER_SESSION):
            message = envelope.message
            print(f"reviewer fetched {envelope.id} from {envelope.sender}: {KIND_LABELS[message.kind]} "
                  f"{message.text!r} (tier {envelope.tier.label})")  # fmt: skip
            if message.kind == Kind.KIND_REQUEST:
                answer = AgentMessage(kind=Kind.KIND_REPLY, text="looks good", in_reply_to=envelope.id)
                sent = await relay.send("reviewer", envelope.sender, answer, session=REVIEWER_SESSION)
                print(f"reviewer -> {envelope.sender}: reply {sent.id}")
            await relay.ack("reviewer", [envelope.id], session=REVIEWER_SESSION)
            print(f"reviewer acknowledged {envelope.id}")


@contextlib.asynccontextmanager
async def backend(redis_url: str | None) -> AsyncIterator[Messenger[AgentMessage]]:
    contract = AgentMessageContract()
    if redis_url is None:
        state = MemoryState()
        relay = Relay(contract, MemoryInboxStore(state), MemoryRegistry(state))
        async with relay, Messenger(relay, MemoryDeliveryQueue(state), SETTINGS) as messenger:
            yield messenger
        return
    from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
    from adapters.redis.delivery import RedisDeliveryQueue

    # a fresh key prefix per run, removed at the end: the example never touches a real relay's keys
    connection = RedisConnection(RedisSettings(url=redis_url, prefix=f"relay-example-{secrets.token_hex(4)}"))
    relay = Relay(contract, RedisInboxStore(connection), RedisRegistry(connection))
    async with relay, Messenger(relay, RedisDeliveryQueue(connection), SETTINGS) as messenger:
        try:
            yield messenger
        finally:
            await connection.delete_prefix()


async def main(redis_url: str | None) -> int:
    print(f"relay example: {'redis' if redis_url else 'memory'} backend")
    sessions = ToySessions()
    async with backend(redis_url) as messenger, SessionMessaging(messenger, sessions) as messaging:
        relay = messenger.relay
        for agent, session in SESSIONS.items():
            sessions.tools[session] = messaging.tools(session)
            (register,) = [t for t in sessions.tools[session] if t.name == "register_agent"]
            done = await register.call({"agent": agent})
            print(f"registered {agent}: {done['provider']} {done['endpoint']} (tier {done['tier']})")
        await relay.register("reviewer", ClaudeCodeAddress.parse("127.0.0.1:14111"), REVIEWER_SESSION)
        print("registered reviewer: claudecode 127.0.0.1:14111 (tier host)")

        stop = asyncio.Event()
        workers = [asyncio.create_task(sessions.work(a, s)) for a, s in SESSIONS.items()]
        workers.append(asyncio.create_task(reviewer(relay, stop)))
        try:
            await sessions.say("planner", "builder", Kind.KIND_REQUEST, "please build the parser")
            await asyncio.wait_for(sessions.finished.wait(), 10.0)
        except TimeoutError:
            print("example did not finish in 10 s", file=sys.stderr)
            return 1
        finally:
            stop.set()
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        dead = sum([await messenger.dead_letter_count(a) for a in SESSIONS])
        print(f"\ndone: {sessions.prompts} prompts queued, {dead} dead letters")
        return 0 if dead == 0 else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="log: %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this Redis instead of the memory backend")
    raise SystemExit(asyncio.run(main(parser.parse_args().redis_url)))
