"""A GitHub Copilot SDK session as a relay agent (``relay[copilot]``: ``github-copilot-sdk`` 1.0.27 and
the Copilot CLI from npm ``@github/copilot`` 1.0.102).

Each session is one ``CopilotClient`` (one CLI process, JSON-RPC over stdio, SDK protocol 3) with one
session in it:

- relay's two tools are Copilot custom tools (``skip_permission``), bound to the session's agent; the
  model is offered only them and the configured ``tools`` (``available_tools``);
- with a provider the session uses it (BYOK, ``provider={"type", "base_url", "api_key"}``; chat
  completions for ``openai``), without one the CLI's own login;
- a prompt is ``session.send(prompt, mode="enqueue")``: *accepted* is the CLI's answer to that call
  (a prompt sent during a turn becomes its own turn after it);
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
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from copilot import CopilotClient, PermissionHandler, RuntimeConnection
from copilot.session import CopilotSession, ProviderConfig
from copilot.tools import Tool, ToolInvocation, ToolResult

from adapters.workbench.runtime import (
    LiveSession,
    SessionGone,
    SessionSpec,
    process_exit,
    relay_instructions,
)
from adapters.workbench.session import SessionTool

log = logging.getLogger("relay.workbench.copilot")

PROTOCOL_VERSION = 3
"""The SDK protocol relay was tested with (the SDK checks the CLI speaks it at start)."""
_STARTED = "user.message"
_IDLE = "session.idle"


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
        self._sent = 0
        self._started = 0
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
        return max(0, self._sent - self._started)

    def holds(self, key: str) -> bool:
        return False  # an accepted prompt is acknowledged at once: nothing waits to be accepted

    async def start(self, tools: Sequence[SessionTool], resume: str | None) -> None:
        spec = self.spec
        client = CopilotClient(
            connection=RuntimeConnection.for_stdio(path=spec.cli_path),
            working_directory=str(spec.directory),
            base_directory=str(spec.state_dir / "copilot"),
            use_logged_in_user=spec.provider is None,
            log_level="error",
            env=_environment(spec.env),
        )
        self._client = client
        await client.start()
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
        if kind in (_STARTED, _IDLE):
            # the SDK may call handlers from its reader thread
            self._loop.call_soon_threadsafe(self._apply, kind)

    def _apply(self, kind: str) -> None:
        if kind == _STARTED:
            self._started += 1
            self._busy = True
        else:
            self._busy = False

    async def submit(self, prompt: str, key: str) -> None:
        if self._session is None or (self._exited is not None and self._exited.done()):
            raise SessionGone(f"the Copilot session of {self.spec.agent!r} is not running")
        sending = asyncio.ensure_future(self._session.send(prompt, mode="enqueue"))
        waits: set[asyncio.Future[Any]] = {sending}
        if self._exited is not None:
            waits.add(self._exited)
        done, _ = await asyncio.wait(waits, timeout=self.spec.accept_timeout, return_when="FIRST_COMPLETED")
        if sending not in done:
            sending.cancel()
            with contextlib.suppress(BaseException):
                await sending
            if self._exited is not None and self._exited.done():
                raise SessionGone(f"the Copilot CLI of {self.spec.agent!r} exited during the submission")
            raise TimeoutError(f"the Copilot CLI did not accept the prompt in {self.spec.accept_timeout} s")
        sending.result()  # raises what the SDK raised (a refusal, a dead connection)
        self._sent += 1

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
