"""Calls nobody waits for any more: their client hung up, or (over MCP) cancelled them.

A parked long-poll holds a wait slot of its agent (``max_waits_per_agent``) until it answers; one whose
client is gone must give it back at once, or a few hung-up callers lock the agent out of long-polls for
as long as their waits last. ``hung_up`` notices the disconnect on the ASGI ``receive`` channel.
``unless_abandoned`` runs a parked call until it answers or its request is abandoned: the client hung
up, or sent ``notifications/cancelled`` for it. With a stateless MCP endpoint each POST is its own MCP
connection, so the SDK cannot match a cancellation to the call it names; ``Cancellations`` does, by
the caller's verified agent and session and the request id, so nobody can cancel another's call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from starlette.types import Receive

T = TypeVar("T")
_Key = tuple[str, str, str | int]
"""Agent, session, JSON-RPC request id."""


async def hung_up(receive: Receive) -> None:
    """Return when the client disconnects; call it once the request's body was read (after that
    nothing else can come on ``receive``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass(slots=True)
class Cancellations:
    """The abandonable calls running now, by agent, session and request id (one per MCP endpoint)."""

    running: dict[_Key, set[asyncio.Event]] = field(default_factory=dict)

    @contextlib.contextmanager
    def watch(self, key: _Key) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self.running.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            events = self.running.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.running[key]

    def cancel(self, key: _Key) -> int:
        """Abandon the calls running under ``key``; how many there were."""
        events = self.running.get(key, ())
        for event in events:
            event.set()
        return len(events)


@dataclass(frozen=True, slots=True)
class Request:
    """What tells that the request of the running call was abandoned."""

    receive: Receive | None
    key: _Key | None
    cancellations: Cancellations


CURRENT: ContextVar[Request | None] = ContextVar("relay_front_request", default=None)
"""The request the running tool call answers (set by the MCP server for each call)."""


async def unless_abandoned(work: Awaitable[T], empty: T) -> T:
    """``work``'s result, or ``empty`` as soon as the current request is abandoned (``work`` is then
    cancelled, which frees what it held); just ``work`` outside a request."""
    request = CURRENT.get()
    if request is None:
        return await work
    doing: asyncio.Future[T] = asyncio.ensure_future(work)
    with contextlib.ExitStack() as stack:
        signals: list[asyncio.Future[Any]] = []
        if request.receive is not None:
            signals.append(asyncio.ensure_future(hung_up(request.receive)))
        if request.key is not None:
            event = stack.enter_context(request.cancellations.watch(request.key))
            signals.append(asyncio.ensure_future(event.wait()))
        try:
            await asyncio.wait({doing, *signals}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for signal in signals:
                if signal.done() and not signal.cancelled():
                    signal.exception()  # retrieved: a receive that failed is a hang-up too
                signal.cancel()
            if not doing.done():
                doing.cancel()
                await asyncio.wait([doing])  # its own cancellation stays inside; the caller's is raised
    if doing.cancelled():
        return empty
    return doing.result()
