"""A Claude Agent SDK session as a relay agent (``relay[claude-agent]``: ``claude-agent-sdk`` 0.2.189,
which bundles Claude Code 2.1.332).

Each session is one ``ClaudeSDKClient`` (one ``claude`` process, stream-JSON over stdio):

- relay's tools are an in-process SDK MCP server named ``relay`` (``mcp__relay__send_agent_message``
  ...), bound to the session's agent; the model gets only them and the configured ``tools``
  (``allowed_tools``, no setting sources: the folder's own settings and hooks are not loaded);
- prompts are written with ``verbatim_prompts`` (no ``@path`` expansion, no slash commands from a
  message's text). A prompt is *taken in* when the turn it starts begins (the CLI's ``init`` system
  message), or, for a prompt written during a turn, which the CLI merges into it (attached to the next
  tool result) or runs as the next turn, at its echo (``--replay-user-messages``, the prompt's own
  uuid) or the start of that next turn. It is *accepted* once the model answered after that (the
  next ``AssistantMessage``) or the turn ended (``ResultMessage``): a CLI killed in between resumes a
  conversation without it. A model slow to answer does not fail the attempt: a prompt taken in long
  enough before the wait ends is accepted then (``taken_in_long_ago``). Acceptance never counts
  results: one turn may answer several prompts. A prompt not accepted within ``accept_timeout`` stays
  written: the retry of the same envelope waits for it instead of writing it again;
- with a provider (``anthropic``) the CLI gets ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` and a
  private ``CLAUDE_CONFIG_DIR`` under ``state_dir``; without one, the CLI's own login;
- the CLI (the wheel's bundled ``claude`` unless ``cli_path`` names one) runs under ``bound_to_host``'s
  launcher, so it dies with the host;
- the conversation id is relay's choice (a UUID) at the first start; a restarted process resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import claude_agent_sdk
from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, create_sdk_mcp_server, tool
from claude_agent_sdk.types import AssistantMessage, ResultMessage, SystemMessage, UserMessage

from adapters.workbench.runtime import (
    LiveSession,
    SessionGone,
    SessionSpec,
    bound_to_host,
    not_accepted,
    quiet_sdk_logs,
    relay_instructions,
    taken_in_long_ago,
)
from adapters.workbench.session import SessionTool

quiet_sdk_logs("claude_agent_sdk")  # its records carry tracebacks of expected failures (a CLI that exited)
log = logging.getLogger("relay.workbench.claude_agent")

SERVER = "relay"
"""The SDK MCP server's name: the tools are ``mcp__relay__<tool>``."""
OPEN_TIMEOUT = 60.0
BUNDLED_CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
"""The ``claude`` the SDK's wheel ships (the SDK's default; named here so the launcher can start it)."""


class ClaudeAgentRuntime:
    """Opens Claude Agent SDK sessions (``runtime = "claude-agent"``)."""

    name = "claude-agent"

    async def open(self, spec: SessionSpec, tools: Sequence[SessionTool], resume: str | None) -> LiveSession:
        if resume is not None:
            live = ClaudeLive(spec, tools, resume=resume)
            try:
                await live.start()
                return live
            except Exception as exc:  # no transcript yet (no turn ran): start it under the same id
                log.info("no conversation to resume (%s): a new one", type(exc).__name__)
                await live.close()
        live = ClaudeLive(spec, tools, session_id=resume or str(uuid.uuid4()))
        try:
            await live.start()
        except BaseException:
            await live.close()
            raise
        return live


def claude_tool(each: SessionTool) -> Any:
    """``each`` as an SDK MCP tool: its JSON result (or error object) is the text the model gets."""

    async def handler(arguments: Any) -> dict[str, Any]:
        result = await each.call(arguments)
        return {"content": [{"type": "text", "text": json.dumps(result)}], "is_error": "error" in result}

    return tool(each.name, each.description, dict(each.input_schema))(handler)


class ClaudeLive:
    """One Claude Agent SDK session in its own ``claude`` process (``LiveSession``).

    The SDK client must be connected and disconnected in one task (it holds an anyio task group):
    ``_run`` owns it, and ``close`` asks it to end.
    """

    def __init__(
        self, spec: SessionSpec, tools: Sequence[SessionTool], *, resume: str | None = None,
        session_id: str | None = None,
    ) -> None:  # fmt: skip
        self.spec = spec
        self._conversation = resume or session_id
        self._options = self._options_for(tools, resume=resume, session_id=session_id)
        self._client: ClaudeSDKClient | None = None
        self._pid: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = asyncio.Event()
        self._waiting: dict[str, asyncio.Future[None]] = {}
        """uuid of a written prompt not taken in yet -> resolved when it is accepted"""
        self._taken: dict[str, tuple[asyncio.Future[None], float]] = {}
        """the same for prompts taken in that the model has not answered yet, with when they were taken
        in (``time.monotonic()``)"""
        self._keys: dict[str, str] = {}
        """envelope key -> uuid of its prompt written to this process and not yet accepted"""
        self._next_turn: set[str] = set()
        """uuids of written prompts the next turn to start takes"""
        self._busy = False
        self._write = asyncio.Lock()

    def _options_for(
        self, tools: Sequence[SessionTool], *, resume: str | None, session_id: str | None
    ) -> ClaudeAgentOptions:
        spec = self.spec
        env = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ENABLE_TOOL_SEARCH": "false", **spec.env}
        if spec.provider is not None:
            env |= {
                "ANTHROPIC_BASE_URL": spec.provider.base_url,
                "ANTHROPIC_API_KEY": spec.provider.api_key,
                "CLAUDE_CONFIG_DIR": str(spec.state_dir / "claude"),
            }
        server = create_sdk_mcp_server(SERVER, tools=[claude_tool(t) for t in tools])
        return ClaudeAgentOptions(
            mcp_servers={SERVER: server},
            tools=list(spec.tools),
            allowed_tools=[*(f"mcp__{SERVER}__{t.name}" for t in tools), *spec.tools],
            setting_sources=[],
            cwd=str(spec.directory),
            model=spec.model,
            system_prompt={"type": "preset", "preset": "claude_code", "append": relay_instructions(spec)},
            verbatim_prompts=True,
            extra_args={"replay-user-messages": None},
            resume=resume,
            session_id=session_id,
            cli_path=bound_to_host(spec.cli_path or str(BUNDLED_CLI), spec.state_dir),
            env=env,
            stderr=lambda line: log.debug("claude: %s", line.rstrip(), extra={"agent": spec.agent}),
        )

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def resume_id(self) -> str | None:
        return self._conversation

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def holds(self, key: str) -> bool:
        return key in self._keys

    async def start(self) -> None:
        connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(connected), name=f"claude-agent-{self.spec.agent}")
        await asyncio.wait_for(asyncio.shield(connected), OPEN_TIMEOUT)

    async def _run(self, connected: asyncio.Future[None]) -> None:
        try:
            async with ClaudeSDKClient(self._options) as client:
                self._client = client
                process = getattr(getattr(client, "_transport", None), "_process", None)  # no public handle
                self._pid = getattr(process, "pid", None)
                connected.set_result(None)
                reading = asyncio.create_task(self._read(client))
                stopping = asyncio.create_task(self._stop.wait())
                await asyncio.wait({reading, stopping}, return_when="FIRST_COMPLETED")
                for task in (reading, stopping):
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
        except Exception as exc:
            if not connected.done():
                connected.set_exception(exc)
            else:
                log.warning("session ended: %s", type(exc).__name__, extra={"agent": self.spec.agent})
        finally:
            self._client = None
            self._closed.set()
            for waiting in (*self._waiting.values(), *(f for f, _ in self._taken.values())):
                if not waiting.done():
                    waiting.set_exception(SessionGone("the claude process exited"))
            self._waiting.clear()
            self._taken.clear()
            self._keys.clear()
            self._next_turn.clear()

    async def _read(self, client: ClaudeSDKClient) -> None:
        async for message in client.receive_messages():
            if isinstance(message, UserMessage) and message.uuid in self._waiting:
                self._took(message.uuid)
            elif isinstance(message, SystemMessage) and message.subtype == "init":
                self._busy = True
                for taken in list(self._next_turn):
                    self._took(taken)
            elif isinstance(message, AssistantMessage):
                self._answered()
            elif isinstance(message, ResultMessage):
                self._answered()
                self._busy = False
                self._next_turn |= set(self._waiting)  # not merged into that turn: they start the next

    def _took(self, written: str) -> None:
        self._next_turn.discard(written)
        waiting = self._waiting.pop(written, None)
        if waiting is not None:
            self._taken[written] = (waiting, time.monotonic())

    def _answered(self) -> None:
        if self._taken:
            answered, self._taken = self._taken, {}
            self._accepted(answered)

    def _accepted(self, taken: Mapping[str, tuple[asyncio.Future[None], float]]) -> None:
        for waiting, _ in taken.values():
            if not waiting.done():
                waiting.set_result(None)
        self._keys = {k: u for k, u in self._keys.items() if u not in taken}

    async def submit(self, prompt: str, key: str) -> None:
        client = self._client
        if client is None or self._closed.is_set():
            raise SessionGone(f"the claude session of {self.spec.agent!r} is not running")
        written = self._keys.get(key)
        if written is not None:
            echo = self._waiting.get(written) or self._taken[written][0]
        else:
            written = str(uuid.uuid4())
            echo = self._waiting[written] = asyncio.get_running_loop().create_future()
            self._keys[key] = written
            if not self._busy:
                self._next_turn.add(written)
                self._busy = True  # a prompt to an idle session starts a turn
            async with self._write:
                try:
                    await client.query(_one(prompt, written))
                except Exception as exc:
                    self._waiting.pop(written, None)
                    self._taken.pop(written, None)
                    self._keys.pop(key, None)
                    self._next_turn.discard(written)
                    raise SessionGone(f"could not write to the claude process: {type(exc).__name__}") from exc
        accepted = asyncio.shield(echo)
        try:
            await asyncio.wait_for(accepted, self.spec.accept_timeout)
        except TimeoutError:
            taken = self._taken.get(written)
            taken_at = None if taken is None else taken[1]
            if taken is not None and taken_in_long_ago(taken_at, self.spec):
                del self._taken[written]
                self._accepted({written: taken})
                return
            raise TimeoutError(not_accepted(taken_at, self.spec)) from None

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._task), 15)
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        self._closed.set()


async def _one(prompt: str, message_uuid: str) -> AsyncIterator[dict[str, Any]]:
    yield {
        "type": "user",
        "message": {"role": "user", "content": prompt},
        "parent_tool_use_id": None,
        "uuid": message_uuid,
    }
