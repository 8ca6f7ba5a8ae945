"""Bounded polling for tests: wait until a condition holds, failing with what was awaited.

The one helper for conditions a test cannot be told about (a metric, a log line, a process's state):
every loop is bounded in count and in time, and a timeout is an ``AssertionError`` that names what did
not happen.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable

Condition = Callable[[], object]


async def eventually(condition: Condition, within: float, what: str, *, interval: float = 0.01) -> float:
    """Await until ``condition()`` (a value or an awaitable of one) is truthy; return the seconds it
    took. Raises ``AssertionError`` naming ``what`` after ``within`` seconds."""
    started = time.monotonic()
    for _ in range(_rounds(within, interval)):
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return time.monotonic() - started
        if time.monotonic() - started >= within:
            break
        await asyncio.sleep(interval)
    raise AssertionError(f"not within {within} s: {what}")


def wait_until(condition: Callable[[], object], within: float, what: str, *, interval: float = 0.02) -> float:
    """``eventually`` for synchronous code (blocks the thread while it waits)."""
    started = time.monotonic()
    for _ in range(_rounds(within, interval)):
        if condition():
            return time.monotonic() - started
        if time.monotonic() - started >= within:
            break
        time.sleep(interval)
    raise AssertionError(f"not within {within} s: {what}")


def _rounds(within: float, interval: float) -> int:
    return max(1, math.ceil(within / interval)) + 1


__all__ = ["eventually", "wait_until"]
