"""The Lua scripts (``lua/*.lua``; each names its KEYS and ARGV once at its top, and
``adapters/redis/protocol*.py`` build them and read the replies), the one Redis Functions library
they make, and its loading.

Every script touches the keys of one hash slot (all named with one ``{agent}`` tag), so each runs on
one cluster node. Scripts that read or write inbox entries use ``lua/_entry.lua``, the one Lua
definition of the stream entry layout (``adapters/redis/entries.py`` is its Python twin); those that
act for a caller's session use ``lua/_session.lua``, the one session check.

relay runs them as functions of one library (``FCALL``): the preludes' helpers are defined once,
when the library loads, rather than on every call as an ``EVALSHA`` script's prelude is (1.3 µs of
Redis CPU per call: docs/performance.md). The library's name carries a hash of its code, so workers
of two relay versions on one Redis each call their own. When a node has no library (first use, a
Redis restarted without persistence, ``FUNCTION FLUSH``), ``ScriptLoader`` loads it there: one
``FUNCTION LOAD`` per node at a time; calls that meet the missing function meanwhile wait for that
load. Redis refuses ``FUNCTION LOAD`` at ``maxmemory``; a call then runs as ``EVAL`` of the same
script (``standalone``: its preludes before it), so a full store can still be drained.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.resources import files

from redis.exceptions import OutOfMemoryError

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

_COMPOSED = {"send": ("send_check", "send_append", "send_refund", "send_note")}
"""Scripts made of other scripts: each part becomes a local function ``name(KEYS, ARGV)`` before the
script's own body (``lua/send.lua``: a whole send in one call on a single Redis)."""

_FLAGS = {
    # reads only: they run on a store at maxmemory too
    "inspect": ("no-writes",),
    "locate": ("no-writes",),
    "peek": ("no-writes",),
    "status": ("no-writes",),
    "status_index": ("no-writes",),
    "thread_read": ("no-writes",),
    # they free memory (XACK, XDEL, DEL) before their bookkeeping writes: a full store is drained
    "fetch": ("allow-oom",),
    "ack": ("allow-oom",),
    "purge": ("allow-oom",),
    "notice": ("allow-oom",),
    "webhook_release": ("allow-oom",),
}
"""Function flags (Redis refuses a function without flags at ``maxmemory``, before it runs)."""

NAMES = (
    "register", "send_check", "send_append", "send_refund", "send_note", "send", "fetch", "sweep",
    "status_index", "status", "ack", "claim", "retry", "dead_letter", "requeue", "inspect", "locate",
    "webhook_secret", "webhook_release", "peek", "notice", "policy_set", "thread_read", "retire",
    "purge", "leave",
)  # fmt: skip
"""Every script relay runs (``lua/<name>.lua``)."""

LIBRARY_PREFIX = "relay_"
_NONE: Mapping[str, str] = {}


@functools.cache
def _file(part: str) -> str:
    return (files("adapters.redis") / "lua" / f"{part}.lua").read_text(encoding="utf-8")


def _lua(part: str, sources: Mapping[str, str] = _NONE) -> str:
    found = sources.get(part)
    return _file(part) if found is None else found


def _as_function(part: str, sources: Mapping[str, str] = _NONE) -> str:
    return f"local function {part}(KEYS, ARGV)\n{_lua(part, sources)}end\n"


def read_script(name: str, sources: Mapping[str, str] = _NONE) -> str:
    """The source of ``lua/<name>.lua``, after the preludes it uses (entry layout, session check)."""
    return "".join(_lua(part, sources) for part in [*_PRELUDES.get(name, ()), name])


def _source(name: str, sources: Mapping[str, str]) -> str:
    """``name`` as one script: its preludes, the scripts it is made of, its own body."""
    parts = _COMPOSED.get(name)
    if parts is None:
        return read_script(name, sources)
    preludes = "".join(_lua(part, sources) for part in _PRELUDES[name])
    return preludes + "".join(_as_function(part, sources) for part in parts) + _lua(name, sources)


@functools.cache
def standalone(name: str) -> str:
    """``name`` as one script, for ``EVAL`` when a node cannot load the library: built on first use."""
    return _source(name, _NONE)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    function: str
    """What ``FCALL`` names: ``<library>_<name>``."""


@dataclass(frozen=True, slots=True)
class Library:
    name: str
    source: str
    """``FUNCTION LOAD``'s argument: each script a local function of the library, registered under
    its ``Script.function`` name, after the preludes."""


def build_library(sources: Mapping[str, str] = _NONE) -> tuple[Library, dict[str, Script]]:
    """The library of every script, and the scripts by name; ``sources`` replaces the text of some
    ``lua/*.lua`` files (the bench measures a script without one of its commands that way)."""
    preludes = _lua("_entry", sources) + _lua("_session", sources)
    bodies = "".join(_as_function(name, sources) for name in NAMES)
    code = preludes + bodies + repr(sorted(_FLAGS.items()))  # a flag changed is another library too
    digest = hashlib.sha1(code.encode(), usedforsecurity=False).hexdigest()[:12]
    library = f"{LIBRARY_PREFIX}{digest}"
    scripts = {name: Script(name, f"{library}_{name}") for name in NAMES}
    registrations = "".join(
        f"redis.register_function{{function_name='{s.function}', callback={s.name}, "
        f"flags={{{', '.join(repr(f) for f in _FLAGS.get(s.name, ()))}}}}}\n"
        for s in scripts.values()
    )
    return Library(library, f"#!lua name={library}\n{preludes}{bodies}{registrations}"), scripts


REFUSED_FOR = 1.0
"""Seconds a node that refused the library (``maxmemory``) is not asked to load it again: its calls
run as ``EVAL`` meanwhile, without sending the library along each time."""


@dataclass(slots=True)
class _Loads:
    in_flight: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    done: dict[tuple[str, str], int] = field(default_factory=dict)
    refused: dict[tuple[str, str], tuple[float, Exception]] = field(default_factory=dict)
    counter: int = 0


class ScriptLoader:
    """Single-flight ``FUNCTION LOAD`` of the library per node.

    ``stamp()`` is taken when a call is written; when the call comes back with its function missing,
    ``ensure`` loads the library unless a load on that node finished after the stamp (then the call
    was simply sent too early, and retrying is enough) or is running now (then it waits for it).
    """

    def __init__(self) -> None:
        self._loads = _Loads()

    def stamp(self) -> int:
        return self._loads.counter

    async def ensure(
        self, node: str, library: Library, stamp: int, load: Callable[[str], Awaitable[object]]
    ) -> None:
        key = (node, library.name)
        loads = self._loads
        running = loads.in_flight.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        if loads.done.get(key, -1) > stamp:
            return
        refused = loads.refused.get(key)
        if refused is not None and time.monotonic() - refused[0] < REFUSED_FOR:
            raise refused[1]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        loads.in_flight[key] = future
        try:
            await load(library.source)
        except BaseException as exc:
            if isinstance(exc, OutOfMemoryError):
                loads.refused[key] = (time.monotonic(), exc)
            future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("load cancelled"))
            future.exception()  # retrieved: waiters re-raise it, nobody else has to
            raise
        else:
            loads.counter += 1
            loads.done[key] = loads.counter
            loads.refused.pop(key, None)
            future.set_result(None)
        finally:
            del loads.in_flight[key]


class Scripts:
    """Every script relay runs, by name, and the library they are functions of."""

    def __init__(self) -> None:
        self.library, by_name = build_library()
        self.all = tuple(by_name.values())
        for name, script in by_name.items():
            setattr(self, name, script)

    register: Script
    send_check: Script
    send_append: Script
    send_refund: Script
    send_note: Script
    send: Script
    fetch: Script
    sweep: Script
    status_index: Script
    status: Script
    ack: Script
    claim: Script
    retry: Script
    dead_letter: Script
    requeue: Script
    inspect: Script
    locate: Script
    webhook_secret: Script
    webhook_release: Script
    peek: Script
    notice: Script
    policy_set: Script
    thread_read: Script
    retire: Script
    purge: Script
    leave: Script
