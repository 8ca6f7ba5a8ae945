"""Auto-pipelined script calls: the one way relay runs its Lua scripts.

The rest of the adapter sees it as a ``ScriptPipeline`` (run, command, on_each_primary, commands,
close);
the redis-py internals it relies on are named in ``driver.py``.

Script calls made in the same event-loop turn for the same node go out as one pipeline (one write,
one round trip, at most ``MAX_BATCH`` calls) on one of that node's connections. Redis runs each
script atomically, one after another; every call gets its own reply or error. Under concurrency this
cuts the client's cost per call several times over (docs/performance.md).

What comes back is handled here, once for every script:

- ``Function not found``: the library is loaded on that node (single-flight, ``ScriptLoader``) and
  the call sent again; when Redis refuses the load (``maxmemory``), the call is sent as ``EVAL`` of the
  script itself.
- ``MOVED``: the slot map is updated and the call sent to the new owner; ``ASK``: sent once to the
  importing node behind ``ASKING``.
- ``TRYAGAIN``, ``CLUSTERDOWN``, ``MASTERDOWN``, ``READONLY``, ``LOADING``: the server did not run the
  script; the call is sent again after a short pause (the topology reloaded), until the command
  timeout runs out.
- A connection failure or a timeout (``timeout`` seconds for checkout plus round trip) fails every
  call of that pipeline; the caller decides whether to retry (a send is not retried).

``durable`` calls (sends, acknowledgements, registrations) are followed by ``WAIT replicas`` on the
same connection when ``replicas`` > 0: if fewer replicas confirm within the timeout, each durable call
of that pipeline fails with ``ReplicasBehind`` (the write may have landed, like any timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import hiredis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis import driver
from adapters.redis.routing import Node, Router
from adapters.redis.scripts import Library, Script, ScriptLoader, standalone

MAX_BATCH = 8
"""Calls per pipeline at most; more queued calls in one turn go out as several pipelines, so Redis
runs one while this process handles the replies of another (8 beat 4 and 128 at 16 concurrent callers:
docs/performance.md)."""
_MAX_ATTEMPTS = 16
_MAX_REDIRECTS = 4
"""Rounds of ``commands`` at most while the cluster redirects some of them (MOVED, ASK)."""
_NOT_RUN = (TryAgainError, ClusterDownError, ReadOnlyError)
"""Refusals after which the server has run nothing: sending again is safe even for a send."""


class ReplicasBehind(RedisTimeoutError):
    """``WAIT`` saw fewer replicas than required within the timeout; the write may have landed."""


class ScriptPipeline(Protocol):
    """What the rest of the adapter sees of the auto-pipelined client (``RedisConnection`` holds one)."""

    async def run(
        self, script: Script, keys: Sequence[str], args: Sequence[str | int], *, durable: bool = False
    ) -> Any:
        """Run ``script`` on the node of ``keys[0]``; its reply, or its error raised."""

    async def command(self, key: str | None, *args: str | int) -> Any:
        """One plain command on the node of ``key`` (the first master when None)."""

    async def on_each_primary(self, *args: str | int) -> list[Any]:
        """One plain command on every master, in turn; their replies."""

    async def commands(self, calls: Sequence[tuple[str, tuple[str | int, ...]]]) -> list[Any]:
        """Plain commands, each on the node of its key: one round trip per node, the nodes together;
        the replies in order (an error reply as its exception, not raised)."""

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Call:
    script: Script
    key: str
    args: tuple[str | int, ...]
    """numkeys, keys, args: FCALL's arguments after the function."""
    durable: bool
    future: asyncio.Future[Any]
    started: float
    attempts: int = 0
    stamp: int = 0
    inline: bool = False
    """Sent as ``EVAL`` of the script's source: the node refused to load the library."""


class AutoPipeline:
    def __init__(
        self, router: Router, loader: ScriptLoader, library: Library, timeout: float, replicas: int = 0
    ) -> None:
        self._router = router
        self._loader = loader
        self._library = library
        self._timeout = timeout
        self._replicas = replicas
        self._queues: dict[tuple[str, bool], tuple[Node, list[_Call]]] = {}
        self._flush_scheduled = False
        self._busy = 0
        """Round trips of script calls in flight."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(
        self, script: Script, keys: Sequence[str], args: Sequence[str | int], *, durable: bool = False
    ) -> Any:
        """Run ``script``; every key must be in one hash slot (the first one routes the call).

        A call made while no round trip is in flight or queued goes out at once, in the caller's own
        task; one made while others are busy is queued for the pipeline of this event-loop turn."""
        call = _Call(
            script,
            keys[0],
            (len(keys), *keys, *args),
            durable and self._replicas > 0,
            asyncio.get_running_loop().create_future(),
            time.monotonic(),
        )
        if self._busy or self._flush_scheduled:
            self._enqueue(call)
        else:
            try:
                node = self._router.node_for(call.key)
            except Exception:
                self._enqueue(call)  # routes it again, or retries it later
            else:
                await self._run(node, [call])
        return await call.future

    def _enqueue(self, call: _Call) -> None:
        try:
            node = self._router.node_for(call.key)
        except Exception as exc:  # no node serves the slot (a cluster still forming or failing)
            self._retry_later(call, exc)
            return
        entry = self._queues.get((node.name, call.durable))
        if entry is None:
            entry = self._queues[node.name, call.durable] = (node, [])
        entry[1].append(call)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queues, self._queues = self._queues, {}
        for node, calls in queues.values():
            for start in range(0, len(calls), MAX_BATCH):
                self._spawn(self._run(node, calls[start : start + MAX_BATCH]))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, node: Node, calls: list[_Call], asking: bool = False) -> None:
        self._busy += 1
        try:
            await self._send(node, calls, asking)
        finally:
            self._busy -= 1

    async def _send(self, node: Node, calls: list[_Call], asking: bool) -> None:
        stamp = self._loader.stamp()
        commands: list[tuple[str | int, ...]] = []
        for call in calls:
            call.stamp = stamp
            if asking:
                commands.append(("ASKING",))
            if call.inline:
                commands.append(("EVAL", standalone(call.script.name), *call.args))
            else:
                commands.append(("FCALL", call.script.function, *call.args))
        durable = calls[0].durable
        if durable:
            commands.append(("WAIT", self._replicas, max(1, int(self._timeout * 1000) - 250)))
        try:
            replies = await self._roundtrip(node, commands)
        except Exception as exc:
            if isinstance(exc, RedisConnectionError | OSError) and self._router.cluster:
                self._spawn(self._router.refresh())
            for call in calls:
                _fail(call, exc)
            return
        except BaseException:
            for call in calls:
                call.future.cancel()
            raise
        if asking:
            replies = replies[1::2] + replies[len(calls) * 2 :]
        behind = None
        if durable:
            confirmed = replies.pop()
            if not isinstance(confirmed, int) or confirmed < self._replicas:
                behind = ReplicasBehind(
                    f"only {confirmed} of {self._replicas} replicas confirmed the write within "
                    f"{self._timeout}s; it may have landed"
                )
        for call, reply in zip(calls, replies, strict=True):
            if call.future.done():
                continue
            if not isinstance(reply, ResponseError):
                if behind is not None:
                    call.future.set_exception(behind)
                else:
                    call.future.set_result(reply)
            else:
                self._spawn(self._handle(node, call, reply))

    async def _handle(self, node: Node, call: _Call, error: ResponseError) -> None:
        call.attempts += 1
        if call.attempts > _MAX_ATTEMPTS:
            _fail(call, error)
            return
        try:
            if _missing(error):
                try:
                    await self._loader.ensure(
                        node.name, self._library, call.stamp, lambda s: self._load(node, s)
                    )
                except OutOfMemoryError:
                    call.inline = True
            elif isinstance(error, MovedError):
                await self._router.moved(error)
            elif isinstance(error, AskError):
                await self._run(self._router.node_at(str(error.host), int(error.port)), [call], asking=True)
                return
            elif isinstance(error, _NOT_RUN):
                self._retry_later(call, error)
                return
            else:
                _fail(call, error)
                return
        except Exception as exc:
            _fail(call, exc)
            return
        self._enqueue(call)

    def _retry_later(self, call: _Call, error: Exception) -> None:
        """Send ``call`` again after a pause and a topology reload, unless its time is up."""
        if time.monotonic() - call.started + 0.05 * call.attempts > self._timeout:
            _fail(call, error)
            return

        async def later() -> None:
            await asyncio.sleep(min(0.05 * call.attempts, 0.5))
            try:
                await self._router.refresh()
            except Exception as exc:
                if time.monotonic() - call.started > self._timeout:
                    _fail(call, exc)
                    return
            call.attempts += 1
            self._enqueue(call)

        self._spawn(later())

    async def _load(self, node: Node, source: str) -> None:
        try:
            await self._command_on(node, "FUNCTION", "LOAD", source)
        except ResponseError as exc:
            if "already exists" not in str(exc):  # another worker loaded it meanwhile
                raise

    async def _roundtrip(self, node: Node, commands: list[tuple[str | int, ...]]) -> list[Any]:
        """Write ``commands`` at once and read their replies (error replies as values); checkout and
        round trip together take at most ``timeout``."""
        connection = None
        try:
            async with asyncio.timeout(self._timeout):
                connection = await node.take()
                await driver.write(connection, pack(commands))
                replies: list[Any] = []
                for _ in commands:
                    try:
                        replies.append(await driver.read(connection))
                    except ResponseError as exc:
                        replies.append(exc)
        except TimeoutError:
            if connection is not None:
                await node.drop(connection)
            raise RedisTimeoutError(f"no reply from the message store within {self._timeout}s") from None
        except BaseException:
            if connection is not None:
                await node.drop(connection)
            raise
        node.give(connection)
        return replies

    async def command(self, key: str | None, *args: str | int) -> Any:
        """One plain command on the node of ``key`` (the first master when None), through the same
        pools and timeout."""
        node = self._router.node_for(key) if key is not None else self._router.primaries()[0]
        return await self._command_on(node, *args)

    async def on_each_primary(self, *args: str | int) -> list[Any]:
        return [await self._command_on(node, *args) for node in self._router.primaries()]

    async def commands(self, calls: Sequence[tuple[str, tuple[str | int, ...]]]) -> list[Any]:
        # for reads of many keys at once (the directory's filter): through this packer and reader
        # 1,000 EXISTS took 1.6 ms, through redis-py's pipeline 10 ms (one Redis, this machine)
        replies: list[Any] = [None] * len(calls)
        todo = [(i, self._router.node_for(key), False) for i, (key, _) in enumerate(calls)]
        for _ in range(_MAX_REDIRECTS):
            groups: dict[tuple[str, bool], tuple[Node, list[int]]] = {}
            for i, node, asking in todo:
                groups.setdefault((node.name, asking), (node, []))[1].append(i)
            rounds = await asyncio.gather(
                *(
                    self._roundtrip(node, [c for i in chosen for c in _asked(calls[i][1], asking)])
                    for (_, asking), (node, chosen) in groups.items()
                )
            )
            todo = []
            for ((_, asking), (_, chosen)), got in zip(groups.items(), rounds, strict=True):
                for i, reply in zip(chosen, got[1::2] if asking else got, strict=True):
                    replies[i] = reply
                    if isinstance(reply, MovedError):  # the slot moved: ask its new owner
                        await self._router.moved(reply)
                        todo.append((i, self._router.node_for(calls[i][0]), False))
                    elif isinstance(reply, AskError):  # the slot is moving: ask where it goes
                        todo.append((i, self._router.node_at(str(reply.host), int(reply.port)), True))
            if not todo:
                break
        return replies

    async def _command_on(self, node: Node, *args: str | int) -> Any:
        (reply,) = await self._roundtrip(node, [args])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._router.close()


def pack(commands: Sequence[Sequence[str | int]]) -> bytes:
    """RESP for ``commands``, encoded by hiredis in C: the same bytes as redis-py's encoder at about
    a fifth of ``Connection.pack_commands``'s cost for script calls (docs/performance.md)."""
    # hiredis's stub declares a one-element tuple; any tuple of str/int/bytes is packed
    return b"".join([hiredis.pack_command(tuple(command)) for command in commands])  # type: ignore[arg-type]


def _asked(command: tuple[str | int, ...], asking: bool) -> list[tuple[str | int, ...]]:
    return [("ASKING",), command] if asking else [command]


def _missing(error: ResponseError) -> bool:
    """Whether the node has no such function: its library is not loaded there."""
    return str(error).startswith("Function not found")


def _fail(call: _Call, error: BaseException) -> None:
    if not call.future.done():
        call.future.set_exception(error)


__all__ = ["MAX_BATCH", "AutoPipeline", "BusyLoadingError", "ReplicasBehind", "ScriptPipeline"]
