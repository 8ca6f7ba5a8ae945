"""``POST /agent/wait``: the mail-pending wait as a plain authenticated HTTP route.

Same three agent headers as ``/mcp/agent`` (checked by the same ``AgentAuthMiddleware``, so a reloaded
key file applies to both). Body: ``{"timeout_ms": N}``, N from 0 to ``MAX_TIMEOUT_MS``. The answer
(200) is ``{"count", "unacknowledged", "reminder", "envelopes": [{"id", "from", "kind", "preview",
"sent_at"}, ...]}``: ``count`` 0 when the timeout passed (or relay is shutting down) with nothing to
announce. Semantics: ``Relay.wait_for_mail`` and ``broker.ports.INoticeStore``; it never acknowledges
and never changes what ``FetchAgentInbox`` returns. Refusals carry ``broker.errors.error_body`` with the
status of ``broker.front.errors.http_status``. A caller that hangs up stops its wait at once.

``POST /agent/leave`` (``LeaveRoute``), with the same headers and an empty body (or ``{}``), says the
caller's session ended (``Relay.leave``): the answer is ``{"ended": true}`` when it was the registered
session (its presence reads ``gone`` until its next sign), ``{"ended": false}`` otherwise.

Not MCP on purpose: Claude Code's hook waiter is a short stdlib process, and a long-poll inside an MCP
tool call would hold a model turn; the route also keeps ``/mcp/agent`` stateless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Final

from starlette.responses import JSONResponse

from broker.agent_message import KIND_LABELS, AgentMessage
from broker.envelope import format_ms
from broker.errors import InternalError, InvalidArgument, RelayError, error_body, json_type
from broker.front.errors import http_status
from broker.front.hangup import hung_up
from broker.limits import MAX_NOTICE_WAIT_SECONDS
from broker.preview import preview
from broker.relay import MailNotice, Relay
from broker.text import failure, shown

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from broker.front.auth import AgentAuthMiddleware
    from broker.front.tokens import AgentIdentity

log = logging.getLogger("relay.front.wait")

MAX_TIMEOUT_MS: Final = int(MAX_NOTICE_WAIT_SECONDS * 1000)
"""The longest wait a request may ask for."""
MAX_BODY_BYTES: Final = 1024
"""A wait's body is ``{"timeout_ms": N}``; anything much larger is not one."""
_EXAMPLE: Final = '{"timeout_ms": 30000}'


class _AgentPost:
    """An authenticated ``POST`` route of an agent's session: the method and the agent headers
    (``admitted``), and every refusal of the route's work (``refuse``: the body's bound, a caller gone,
    relay's errors, the one log line of an unexpected failure), answered here once for both routes.
    Each route's ``__call__`` is the one coroutine a request holds: a parked wait keeps no frame of
    this class (a coroutine more per waiter was about 0.3 KiB of 10,000 idle waiters' memory)."""

    post: str
    """What to POST (the 405's message)."""
    doing: str
    """What the route does (the log line of an unexpected failure)."""

    def __init__(self, relay: Relay[AgentMessage], auth: AgentAuthMiddleware) -> None:
        self.relay = relay
        self.auth = auth

    async def admitted(self, scope: Scope, receive: Receive, send: Send) -> AgentIdentity | None:
        """The caller's identity, or None once it was answered (not HTTP, not a POST, not
        authenticated)."""
        if scope["type"] != "http":
            return None
        if scope.get("method") != "POST":
            refused = _refusal("method", "method.post", self.post)
            await _answer(scope, receive, send, 405, refused, {"allow": "POST"})
            return None
        return await self.auth.authenticate(scope, send)

    async def refuse(
        self, exc: Exception, identity: AgentIdentity, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answer the failure ``exc`` of the route's work (nobody, when the caller is gone)."""
        if isinstance(exc, _TooLarge):
            refused = _refusal("body", "body.max_bytes", f"at most {MAX_BODY_BYTES} bytes")
            await _answer(scope, receive, send, 413, refused)
        elif isinstance(exc, RelayError):
            await _answer(scope, receive, send, http_status(exc), error_body(exc))
        elif not isinstance(exc, _Gone):
            log.error("%s of %s failed: %s", self.doing, identity.agent, failure(exc))
            internal = InternalError()
            await _answer(scope, receive, send, http_status(internal), error_body(internal))


class WaitRoute(_AgentPost):
    """The ASGI app of ``POST /agent/wait`` (see the module docstring)."""

    post, doing = "POST the wait", "the mail-pending wait"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        identity = await self.admitted(scope, receive, send)
        if identity is None:
            return
        try:
            timeout_ms = parse_body(await _body(receive))
            # the wait runs in this task; a small watcher cancels it if the caller hangs up (freeing
            # the parked slot at once): two tasks per waiter, the request's and the watcher's
            waiting = _Waiting(asyncio.current_task())
            watching = asyncio.ensure_future(_hang_up(receive, waiting))
            try:
                notice = await self.relay.wait_for_mail(identity.agent, identity.session, timeout_ms / 1000)
            except asyncio.CancelledError:
                if watching.done() and not watching.cancelled():
                    return  # hung up: nobody to answer
                raise
            finally:
                waiting.task = None  # set before any further await: the watcher can no longer cancel
                watching.cancel()
        except Exception as exc:
            await self.refuse(exc, identity, scope, receive, send)
            return
        await _answer(scope, receive, send, 200, answer(notice))


class LeaveRoute(_AgentPost):
    """The ASGI app of ``POST /agent/leave`` (see the module docstring)."""

    post, doing = "POST that the session ended", "the leave"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        identity = await self.admitted(scope, receive, send)
        if identity is None:
            return
        try:
            if (await _body(receive)).strip() not in (b"", b"{}"):
                empty = "the body is {} (or nothing): leave takes no field"
                raise InvalidArgument("body", "body.empty", empty)
            ended = await self.relay.leave(identity.agent, identity.session)
        except Exception as exc:
            await self.refuse(exc, identity, scope, receive, send)
            return
        await _answer(scope, receive, send, 200, {"ended": ended})


def parse_body(raw: bytes) -> int:
    """``timeout_ms`` of a wait's body; ``InvalidArgument`` naming the field and rule otherwise."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise InvalidArgument("body", "body.json", f"the body must be JSON such as {_EXAMPLE}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(
            "body", "body.type", f"must be a JSON object such as {_EXAMPLE}, got {json_type(data)}"
        )
    for name in data:
        if name != "timeout_ms":
            field = shown(name)  # client text, into a log line and a JSON answer: escaped and cut
            raise InvalidArgument(
                field, "body.unknown_field", f"unknown field {field!r}: the body has only timeout_ms"
            )
    if "timeout_ms" not in data:
        raise InvalidArgument("timeout_ms", "timeout_ms.required", f"is required, e.g. {_EXAMPLE}")
    value = data["timeout_ms"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            "timeout_ms", "timeout_ms.type", f"must be a whole number of milliseconds, got {json_type(value)}"
        )
    if not 0 <= value <= MAX_TIMEOUT_MS:
        raise InvalidArgument("timeout_ms", "timeout_ms.range", f"must be from 0 to {MAX_TIMEOUT_MS}")
    return value


def answer(notice: MailNotice[AgentMessage]) -> dict[str, object]:
    """The 200 body for ``notice``; previews are one escaped line of at most ~120 characters."""
    return {
        "count": notice.count,
        "unacknowledged": notice.unacknowledged,
        "reminder": notice.reminder,
        "envelopes": [
            {
                "id": envelope.id,
                "from": envelope.sender,
                "kind": KIND_LABELS.get(envelope.message.kind, str(envelope.message.kind)),
                "preview": preview(envelope.message.text),
                "sent_at": format_ms(envelope.sent_at_ms),
            }
            for envelope in notice.envelopes
        ],
    }


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class _Waiting:
    """The request task while it waits (None once the wait is over)."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task


async def _hang_up(receive: Receive, waiting: _Waiting) -> None:
    """Cancel the wait when the caller disconnects (the body was read: nothing else can come)."""
    await hung_up(receive)
    if waiting.task is not None:
        waiting.task.cancel()


def _refusal(field: str, rule: str, message: str) -> dict[str, object]:
    return error_body(InvalidArgument(field, rule, message))


async def _answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> None:
    response = JSONResponse(
        body, status_code=status, headers={"cache-control": "no-store", **(headers or {})}
    )
    with contextlib.suppress(OSError):  # the caller may have left meanwhile
        await response(scope, receive, send)
