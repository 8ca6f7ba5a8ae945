"""``relay workbench --config workbench.toml``: the configured agent SDK sessions as in-process agents.

One process hosts every session of the config (each in its own CLI process) on the store ``relay
serve`` uses (``--redis-url``, else the embedded server running from the data dir). At start each
session is opened, then its agent registered (a ``workbench`` address: tier ``in_process``), so mail
can arrive before any model turn; from then on every message to it becomes a prompt in its session
(``adapters.workbench``). SIGINT/SIGTERM stop it: delivery loops finish their current prompt, the
sessions are closed. What a loop held when the process was killed is taken over by the next start
after the visibility timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.inspect import redacted
from adapters.redis.operator_view import RedisOperatorView
from adapters.workbench import SessionMessaging
from adapters.workbench.runtime import Provider, Runtime, SessionSpec, WorkbenchSessions
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.delivery import DeliverySettings
from broker.messenger import Messenger
from broker.relay import Relay
from relay.workbench_config import AgentConfig, Loaded

log = logging.getLogger("relay.workbench")

RUNTIME_CLASSES = {
    "copilot": ("adapters.workbench.copilot", "CopilotRuntime"),
    "claude-agent": ("adapters.workbench.claude_agent", "ClaudeAgentRuntime"),
}
"""Imported only when a configured agent uses it: relay runs without either SDK installed."""


class SessionStartError(RuntimeError):
    """A configured session could not be opened (its CLI missing or failing); nothing was registered."""


def session_id(agent: str) -> str:
    """The relay session (and ``workbench`` endpoint) of a Workbench agent."""
    return f"workbench.{agent}"


def delivery_settings(loaded: Loaded) -> DeliverySettings:
    delivery = loaded.config.delivery
    return DeliverySettings(max_attempts=delivery.max_attempts, visibility=delivery.visibility_seconds)


def specs(loaded: Loaded, data_dir: Path) -> list[tuple[str, SessionSpec]]:
    """(runtime name, spec) of every configured agent."""
    found: list[tuple[str, SessionSpec]] = []
    for n, agent in enumerate(loaded.config.agent):
        found.append((agent.runtime, _spec(loaded, n, agent, data_dir)))
    return found


def _spec(loaded: Loaded, n: int, agent: AgentConfig, data_dir: Path) -> SessionSpec:
    provider = None
    if agent.provider is not None:
        url, key = loaded.base_urls[n], loaded.keys[n]
        assert url is not None and key is not None  # checked by the loader
        provider = Provider(agent.provider.type, url, key)
    settings = delivery_settings(loaded)
    return SessionSpec(
        agent=agent.id,
        session=session_id(agent.id),
        model=agent.model,
        directory=loaded.directories[n],
        state_dir=(data_dir / "workbench" / agent.id).absolute(),
        instructions=agent.instructions,
        tools=agent.tools,
        provider=provider,
        cli_path=None if agent.cli_path is None else str(loaded.folder / agent.cli_path),
        max_queued=agent.max_queued,
        # a submission that waits longer than the handler timeout counts as failed anyway
        accept_timeout=max(1.0, settings.handler_limit - 1.0),
    )


def runtime(name: str) -> Runtime:
    module, cls = RUNTIME_CLASSES[name]
    made: Runtime = getattr(importlib.import_module(module), cls)()
    return made


def run(loaded: Loaded, url: str, data_dir: Path) -> int:
    """Host the sessions until SIGINT/SIGTERM; the exit code."""
    return asyncio.run(host(loaded, url, data_dir))


async def host(
    loaded: Loaded,
    url: str,
    data_dir: Path,
    *,
    stop: asyncio.Event | None = None,
    prefix: str | None = None,
    sessions: WorkbenchSessions | None = None,
    ready: asyncio.Event | None = None,
) -> int:
    """Host ``loaded``'s sessions until ``stop`` is set (default: SIGINT/SIGTERM); ``ready`` is set once
    every agent is registered. ``prefix`` (the store's key prefix) and ``sessions`` are for tests and
    the benchmark."""
    stop = stop or _stop_on_signals()
    connection = RedisConnection(_redis(url, prefix))
    # the sessions' search_agent_messages reads the histories through the messenger's own connection
    view = RedisOperatorView(connection)
    async with messenger_over(connection, delivery_settings(loaded)) as messenger:
        stopping: set[asyncio.Task[None]] = set()
        messaging: SessionMessaging | None = None

        def unavailable(agent: str) -> None:
            if messaging is not None:
                task = asyncio.create_task(messaging.stop(agent))
                stopping.add(task)
                task.add_done_callback(stopping.discard)

        if sessions is None:
            sessions = WorkbenchSessions()
        sessions.on_unavailable = unavailable
        try:
            async with SessionMessaging(messenger, sessions, view) as messaging:
                planned = specs(loaded, data_dir)
                for _, spec in planned:
                    spec.directory.mkdir(parents=True, exist_ok=True)
                # opened one after another: each CLI start costs a core for about a second
                for name, spec in planned:
                    tools = messaging.tools(spec.session, agent=spec.agent)
                    try:
                        await sessions.start(runtime(name), spec, tools)
                    except Exception as exc:
                        problem = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                        raise SessionStartError(
                            f"agent {spec.agent!r}: could not open its {name} session ({problem})"
                        ) from None
                for _, spec in planned:
                    await messaging.register(spec.session, spec.agent)
                    log.info("registered", extra={"agent": spec.agent, "session": spec.session})
                log.info(
                    "workbench serving %d agents on %s: %s",
                    len(planned),
                    redacted(url),
                    ", ".join(f"{s.agent} ({name})" for name, s in planned),
                )
                # what start-up allocated (the SDKs' modules, each session's client and CLI handshake)
                # lives as long as the host: out of the collector's way, a full collection scans only
                # what came since (over all of it, one took 64 ms of the loop every prompt waits on)
                gc.freeze()
                if ready is not None:
                    ready.set()
                await stop.wait()
                log.info("stopping: delivery loops finish their current prompt")
        finally:
            await sessions.close()
            for task in list(stopping):
                with contextlib.suppress(Exception):
                    await task
    log.info("workbench stopped")
    return 0


@contextlib.asynccontextmanager
async def messenger_on(
    url: str, settings: DeliverySettings, *, prefix: str | None = None
) -> AsyncIterator[Messenger[AgentMessage]]:
    """The Workbench host's started messenger on the store at ``url`` (the messenger conformance suite
    runs on it: tests/test_messenger_conformance.py)."""
    async with messenger_over(RedisConnection(_redis(url, prefix)), settings) as messenger:
        yield messenger


@contextlib.asynccontextmanager
async def messenger_over(
    connection: RedisConnection, settings: DeliverySettings
) -> AsyncIterator[Messenger[AgentMessage]]:
    """A started messenger on ``connection`` (its relay and delivery queue share it)."""
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
    )
    async with relay, Messenger(relay, RedisDeliveryQueue(connection), settings) as messenger:
        yield messenger


def _redis(url: str, prefix: str | None) -> RedisSettings:
    return RedisSettings(url=url) if prefix is None else RedisSettings(url=url, prefix=prefix)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
