"""A Claude Agent SDK session as a relay agent (``relay[claude-agent]``: ``claude-agent-sdk`` 0.2.189,
which bundles Claude Code 2.1.332).

Each session is one ``ClaudeSDKClient`` (one ``claude`` process, stream-JSON over stdio):

- relay's two tools are an in-process SDK MCP server named ``relay`` (``mcp__relay__send_agent_message``
  ...), bound to the session's agent; the model gets only them and the configured ``tools``
  (``allowed_tools``, no setting sources: the folder's own settings and hooks are not loaded);
- prompts are written with ``verbatim_prompts`` (no ``@path`` expansion, no slash commands from a
  message's text) and ``--replay-user-messages``: the CLI echoes each user message as it takes it into
  the conversation, and that echo of the prompt's own uuid is *accepted*. A prompt written during a
  turn is merged into it (attached to the next tool result) or becomes the next turn; either way it
  is echoed once, so acceptance never counts results. A prompt not echoed within ``accept_timeout``
  stays written: the retry of the same envelope waits for that echo instead of writing it again;
- with a provider (``anthropic``) the CLI gets ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` and a
  private ``CLAUDE_CONFIG_DIR`` under ``state_dir``; without one, the CLI's own login;
- the conversation id is relay's choice (a UUID) at the first start; a restarted process resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, create_sdk_mcp_server, tool
from claude_agent_sdk.types import ResultMessage, UserMessage

from adapters.workbench.runtime import LiveSession, SessionGone, SessionSpec, relay_instructions
from adapters.workbench.session import SessionTool

log = logging.getLogger("relay.workbench.claude_agent")

SERVER = "relay"
"""The SDK MCP server's name: the tools are ``mcp__relay__<tool>``."""
OPEN_TIMEOUT = 60.0


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
        """uuid of a written prompt -> resolved when the CLI echoes it"""
        self._keys: dict[str, str] = {}
        """envelope key -> uuid of its prompt written to this process and not yet echoed"""
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
            cli_path=spec.cli_path,
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
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_exception(SessionGone("the claude process exited"))
            self._waiting.clear()
            self._keys.clear()

    async def _read(self, client: ClaudeSDKClient) -> None:
        async for message in client.receive_messages():
            if isinstance(message, UserMessage) and message.uuid in self._waiting:
                self._busy = True
                self._accepted(message.uuid)
            elif isinstance(message, ResultMessage):
                self._busy = False

    def _accepted(self, echoed: str) -> None:
        waiting = self._waiting.pop(echoed)
        if not waiting.done():
            waiting.set_result(None)
        for key, written in list(self._keys.items()):
            if written == echoed:
                del self._keys[key]

    async def submit(self, prompt: str, key: str) -> None:
        client = self._client
        if client is None or self._closed.is_set():
            raise SessionGone(f"the claude session of {self.spec.agent!r} is not running")
        written = self._keys.get(key)
        if written is not None:
            echo = self._waiting[written]
        else:
            written = str(uuid.uuid4())
            echo = self._waiting[written] = asyncio.get_running_loop().create_future()
            self._keys[key] = written
            async with self._write:
                try:
                    await client.query(_one(prompt, written))
                except Exception as exc:
                    self._waiting.pop(written, None)
                    self._keys.pop(key, None)
                    raise SessionGone(f"could not write to the claude process: {type(exc).__name__}") from exc
        accepted = asyncio.shield(echo)
        try:
            await asyncio.wait_for(accepted, self.spec.accept_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"the session has not taken the prompt in after {self.spec.accept_timeout} s (a long turn); "
                "it stays written and the retry waits for it"
            ) from None

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
