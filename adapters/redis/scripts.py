"""The Lua scripts (``lua/*.lua``; each names its KEYS and ARGV once at its top, and
``adapters/redis/protocol*.py`` build them and read the replies) and their loading.

Every script touches the keys of one hash slot (all named with one ``{agent}`` tag), so each runs on
one cluster node. Scripts that read or write inbox entries start with ``lua/_entry.lua``, the one
Lua definition of the stream entry layout (``adapters/redis/entries.py`` is its Python twin); those
that act for a caller's session start with ``lua/_session.lua``, the one session check.

``ScriptLoader`` loads a script into a node's cache when the node says ``NOSCRIPT`` (first use, or
after a restart or ``SCRIPT FLUSH``): one ``SCRIPT LOAD`` per script and node at a time; calls that
hit ``NOSCRIPT`` meanwhile wait for that load instead of starting their own.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.resources import files

_PRELUDES = {
    "send_append": ("_entry",),
    "ack": ("_entry", "_session"),
    "retry": ("_entry",),
    "fetch": ("_entry", "_session"),
    "send_check": ("_session",),
    "locate": ("_entry",),
    "dead_letter": ("_entry",),
    "status": ("_entry",),
    "status_index": ("_session",),
    "sweep": ("_entry",),
    "send": ("_entry", "_session"),
    "notice": ("_session",),
    "requeue": ("_entry",),
    "thread_read": ("_entry",),
    "purge": ("_entry",),
    "peek": ("_entry",),
}


def read_script(name: str) -> str:
    """The source of ``lua/<name>.lua``, after the preludes it uses (entry layout, session check)."""
    root = files("adapters.redis") / "lua"
    parts = [*_PRELUDES.get(name, ()), name]
    return "".join((root / f"{part}.lua").read_text(encoding="utf-8") for part in parts)


_COMPOSED = {"send": ("send_check", "send_append", "send_refund", "send_note")}
"""Scripts made of other scripts: each part becomes a local function ``name(KEYS, ARGV)`` before the
script's own body (``lua/send.lua``: a whole send in one call on a single Redis)."""


def _source(name: str) -> str:
    parts = _COMPOSED.get(name)
    if parts is None:
        return read_script(name)
    root = files("adapters.redis") / "lua"
    functions = [
        f"local function {part}(KEYS, ARGV)\n{(root / f'{part}.lua').read_text(encoding='utf-8')}end\n"
        for part in parts
    ]
    preludes = "".join((root / f"{part}.lua").read_text(encoding="utf-8") for part in _PRELUDES[name])
    return preludes + "".join(functions) + (root / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def named(cls, name: str) -> Script:
        source = _source(name)
        return cls(name, source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest())


@dataclass(slots=True)
class _Loads:
    in_flight: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    done: dict[tuple[str, str], int] = field(default_factory=dict)
    counter: int = 0


class ScriptLoader:
    """Single-flight ``SCRIPT LOAD`` per (node, script).

    ``stamp()`` is taken when a call is written; when the call comes back ``NOSCRIPT``, ``ensure``
    loads the script unless a load on that node finished after the stamp (then the call was simply
    sent too early, and retrying is enough) or is running now (then it waits for it).
    """

    def __init__(self) -> None:
        self._loads = _Loads()

    def stamp(self) -> int:
        return self._loads.counter

    async def ensure(
        self, node: str, script: Script, stamp: int, load: Callable[[str], Awaitable[object]]
    ) -> None:
        key = (node, script.sha)
        loads = self._loads
        running = loads.in_flight.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        if loads.done.get(key, -1) > stamp:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        loads.in_flight[key] = future
        try:
            await load(script.source)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("load cancelled"))
            future.exception()  # retrieved: waiters re-raise it, nobody else has to
            raise
        else:
            loads.counter += 1
            loads.done[key] = loads.counter
            future.set_result(None)
        finally:
            del loads.in_flight[key]


class Scripts:
    """Every script relay runs, by name."""

    def __init__(self) -> None:
        self.register = Script.named("register")
        self.send_check = Script.named("send_check")
        self.send_append = Script.named("send_append")
        self.send_refund = Script.named("send_refund")
        self.send_note = Script.named("send_note")
        self.send = Script.named("send")
        self.fetch = Script.named("fetch")
        self.sweep = Script.named("sweep")
        self.status_index = Script.named("status_index")
        self.status = Script.named("status")
        self.ack = Script.named("ack")
        self.claim = Script.named("claim")
        self.retry = Script.named("retry")
        self.dead_letter = Script.named("dead_letter")
        self.requeue = Script.named("requeue")
        self.inspect = Script.named("inspect")
        self.locate = Script.named("locate")
        self.webhook_secret = Script.named("webhook_secret")
        self.webhook_release = Script.named("webhook_release")
        self.peek = Script.named("peek")
        self.notice = Script.named("notice")
        self.policy_set = Script.named("policy_set")
        self.thread_read = Script.named("thread_read")
        self.retire = Script.named("retire")
        self.purge = Script.named("purge")
        self.leave = Script.named("leave")
