"""A GitHub Copilot SDK session as a relay agent (``relay[copilot]``: ``github-copilot-sdk`` 1.0.27 and
the Copilot CLI from npm ``@github/copilot`` 1.0.102).

Each session is one ``CopilotClient`` (one CLI process, JSON-RPC over stdio, SDK protocol 3) with one
session in it:

- relay's tools are Copilot custom tools (``skip_permission``), bound to the session's agent; the
  model is offered only them and the configured ``tools`` (``available_tools``);
- with a provider the session uses it (BYOK, ``provider={"type", "base_url", "api_key"}``; chat
  completions for ``openai``), without one the CLI's own login;
- a prompt is ``session.send(prompt, mode="enqueue")`` (sent during a turn, it becomes its own turn
  after it); it is *accepted* once the model answered the turn that took it in: the session takes it
  in at the ``user.message`` event with the message id ``send`` returned, and the model's answer is
  the first of ``ANSWERED`` after it. Until then a CLI that dies loses it: the request leaves some
  milliseconds after ``user.message``, and a conversation resumed after a kill in between does not
  hold the prompt. A model slow to answer does not fail the attempt: a prompt taken in long enough
  before the wait ends is accepted then (``taken_in_long_ago``). A prompt not taken in within
  ``accept_timeout`` (a long turn ahead of it) stays queued in the CLI: the retry of the same
  envelope waits for it instead of sending it again;
- the CLI runs under ``bound_to_host``'s launcher, so it dies with the host;
- the SDK session id is the one relay chose at the first start, so a restarted process resumes the
  conversation (``resume_session``) from the CLI's state under ``state_dir/copilot``.

The CLI is ``SessionSpec.cli_path``, else ``$COPILOT_CLI_PATH``, else the SDK downloads its own
(which needs network access).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from copilot import CopilotClient, PermissionHandler, RuntimeConnection
from copilot.session import CopilotSession, ProviderConfig
from copilot.tools import Tool, ToolInvocation, ToolResult

from adapters.workbench.runtime import (
    LiveSession,
    SessionGone,
    SessionSpec,
    bound_to_host,
    not_accepted,
    process_exit,
    quiet_sdk_logs,
    relay_instructions,
    taken_in_long_ago,
)
from adapters.workbench.session import SessionTool

quiet_sdk_logs("copilot")  # its records carry tracebacks of expected failures (a CLI that exited)
log = logging.getLogger("relay.workbench.copilot")

PROTOCOL_VERSION = 3
"""The SDK protocol relay was tested with (the SDK checks the CLI speaks it at start)."""
_TAKEN = "user.message"
_IDLE = "session.idle"
ANSWERED = frozenset({"assistant.message", "assistant.turn_end", "session.error", _IDLE})
"""Events that follow the model's answer to the turn's request, or the turn's end (failed or not: a
turn is stored as it ends, so a resumed conversation holds its prompt)."""


class CopilotRuntime:
    """Opens Copilot SDK sessions (``runtime = "copilot"``)."""

    name = "copilot"

    async def open(self, spec: SessionSpec, tools: Sequence[SessionTool], resume: str | None) -> LiveSession:
        live = CopilotLive(spec)
        try:
            await live.start(tools, resume)
        except BaseException:
            await live.close()
            raise
        return live


def copilot_tool(tool: SessionTool) -> Tool:
    """``tool`` as a Copilot custom tool: its JSON result (or error object) is the text the model gets."""

    async def handler(invocation: ToolInvocation) -> ToolResult:
        result = await tool.call(invocation.arguments)
        failed = "error" in result
        return ToolResult(
            text_result_for_llm=json.dumps(result),
            result_type="failure" if failed else "success",
            error=str(result["error"]) if failed else None,
        )

    return Tool(
        name=tool.name,
        description=tool.description,
        handler=handler,
        parameters=dict(tool.input_schema),
        skip_permission=True,
    )


class CopilotLive:
    """One Copilot session in its own CLI process (``LiveSession``)."""

    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec
        self._client: CopilotClient | None = None
        self._session: CopilotSession | None = None
        self._session_id: str | None = None
        self._pid: int | None = None
        self._exited: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[None]] = {}
        """message id -> resolved when the model answered the turn that took that prompt in"""
        self._keys: dict[str, str] = {}
        """envelope key -> message id of its prompt, sent and not yet accepted"""
        self._taken: dict[str, float] = {}
        """message id -> when it was taken in (``time.monotonic()``), until the model answered"""
        self._early: set[str] = set()
        """message ids accepted before ``send`` returned them"""
        self._busy = False
        self._loop = asyncio.get_running_loop()

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def resume_id(self) -> str | None:
        return self._session_id

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def queued(self) -> int:
        return sum(1 for m in self._keys.values() if m not in self._taken)

    def holds(self, key: str) -> bool:
        return key in self._keys

    async def start(self, tools: Sequence[SessionTool], resume: str | None) -> None:
        spec = self.spec
        cli = spec.cli_path or os.environ.get("COPILOT_CLI_PATH")
        client = CopilotClient(
            # without a CLI of its own the SDK downloads one (and the launcher has nothing to start)
            connection=RuntimeConnection.for_stdio(
                path=None if cli is None else bound_to_host(cli, spec.state_dir)
            ),
            working_directory=str(spec.directory),
            base_directory=str(spec.state_dir / "copilot"),
            use_logged_in_user=spec.provider is None,
            log_level="error",
            env=_environment(spec.env),
        )
        self._client = client
        await client.start()
        spoken = getattr(client, "_negotiated_protocol_version", PROTOCOL_VERSION)  # no public accessor
        if spoken != PROTOCOL_VERSION:
            raise RuntimeError(
                f"the Copilot CLI speaks SDK protocol {spoken}, relay is tested with {PROTOCOL_VERSION}: "
                "use @github/copilot 1.0.102 (scripts/install-agent-sdks)"
            )
        process = getattr(client, "_process", None)  # the SDK's Popen of the CLI (no public handle)
        self._pid = getattr(process, "pid", None)
        if self._pid is not None:
            self._exited = asyncio.create_task(process_exit(self._pid), name=f"copilot-exit-{spec.agent}")
        options: dict[str, Any] = {
            "model": spec.model,
            "tools": [copilot_tool(t) for t in tools],
            "available_tools": [*(t.name for t in tools), *spec.tools],
            "on_permission_request": PermissionHandler.approve_all,
            "working_directory": str(spec.directory),
            "system_message": {"mode": "append", "content": relay_instructions(spec)},
            "on_event": self._on_event,
        }
        if spec.provider is not None:
            provider: ProviderConfig = {
                "type": spec.provider.kind,  # type: ignore[typeddict-item]  # checked by the config
                "base_url": spec.provider.base_url,
                "api_key": spec.provider.api_key,
            }
            if spec.provider.kind == "openai":
                provider["wire_api"] = "completions"
            options["provider"] = provider
        session = None
        if resume is not None:
            try:
                session = await client.resume_session(resume, **options)
            except Exception as exc:  # nothing to resume (no turn ran, state removed): a new one
                log.info("no conversation to resume (%s): a new session", type(exc).__name__)
        if session is None:
            session = await client.create_session(session_id=resume or str(uuid.uuid4()), **options)
        self._session = session
        self._session_id = session.session_id

    def _on_event(self, event: Any) -> None:
        kind = getattr(event.type, "value", str(event.type))
        # the SDK may call handlers from its reader thread
        if kind == _TAKEN:
            self._loop.call_soon_threadsafe(self._took, getattr(event.data, "message_id", None))
        elif kind in ANSWERED:
            self._loop.call_soon_threadsafe(self._answered, kind == _IDLE)

    def _took(self, message_id: str | None) -> None:
        self._busy = True
        if message_id is not None:
            self._taken.setdefault(message_id, time.monotonic())

    def _answered(self, idle: bool) -> None:
        if idle:
            self._busy = False
        if self._taken:
            answered, self._taken = self._taken, {}
            self._accepted(answered)

    def _accepted(self, message_ids: Collection[str]) -> None:
        for message_id in message_ids:
            waiting = self._waiting.pop(message_id, None)
            if waiting is None:
                self._early.add(message_id)
            elif not waiting.done():
                waiting.set_result(None)
        self._keys = {k: m for k, m in self._keys.items() if m not in message_ids}

    async def submit(self, prompt: str, key: str) -> None:
        session = self._session
        if session is None or (self._exited is not None and self._exited.done()):
            raise SessionGone(f"the Copilot session of {self.spec.agent!r} is not running")
        message_id = self._keys.get(key)
        if message_id is None:
            message_id = await self._bounded(session.send(prompt, mode="enqueue"), "accept the prompt")
            if message_id in self._early:
                self._early.discard(message_id)
                return
            self._waiting[message_id] = self._loop.create_future()
            self._keys[key] = message_id
        waiting = self._waiting.get(message_id)
        if waiting is None:
            return  # taken in meanwhile
        try:
            await self._bounded(asyncio.shield(waiting), "answer the prompt")
        except TimeoutError:
            taken_at = self._taken.get(message_id)
            if taken_in_long_ago(taken_at, self.spec):
                del self._taken[message_id]
                self._accepted({message_id})
                return
            raise TimeoutError(not_accepted(taken_at, self.spec)) from None

    async def _bounded(self, awaitable: Any, what: str) -> Any:
        """``awaitable``'s result, unless the CLI exits first (``SessionGone``) or ``accept_timeout``
        passes (``TimeoutError``)."""
        task = asyncio.ensure_future(awaitable)
        waits: set[asyncio.Future[Any]] = {task}
        if self._exited is not None:
            waits.add(self._exited)
        done, _ = await asyncio.wait(waits, timeout=self.spec.accept_timeout, return_when="FIRST_COMPLETED")
        if task in done:
            return task.result()  # raises what the SDK raised (a refusal, a dead connection)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self._exited is not None and self._exited.done():
            self._keys.clear()
            raise SessionGone(f"the Copilot CLI of {self.spec.agent!r} exited before it would {what}")
        raise TimeoutError(f"the Copilot CLI did not {what} in {self.spec.accept_timeout} s")

    async def wait_closed(self) -> None:
        if self._exited is None:
            await asyncio.Event().wait()  # no process to watch: only close ends it
        else:
            await asyncio.shield(self._exited)

    async def close(self) -> None:
        session, self._session = self._session, None
        client, self._client = self._client, None
        if session is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.disconnect(), 5)
        if client is not None:
            try:
                await asyncio.wait_for(client.stop(), 10)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.force_stop(), 5)
        if self._exited is not None and not self._exited.done():
            self._exited.cancel()


def _environment(extra: Mapping[str, str]) -> dict[str, str] | None:
    if not extra:
        return None  # the CLI inherits this process's environment
    return {**os.environ, **extra}
