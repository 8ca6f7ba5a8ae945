"""Whether an agent's session is ``live`` or ``gone``, from the signs the stores already record.

A sign is anything the agent's session does that its registration's ``seen_at`` (``Registration.
last_seen_ms``, ms of the store's clock) records: registering, fetching, acknowledging, a mail-pending
wait (``POST /agent/wait``; each wait records when it starts and when it looks again), and its webhook
endpoint taking a notification. A parked wait is a sign for as long as it is parked: no wait parks
longer than ``MAX_NOTICE_WAIT_SECONDS`` (a fetch ``MAX_WAIT_SECONDS``), and every wait that ends is
followed by the next one within the window, so an agent waiting all the time stays ``live``.
Sends, status and directory calls are not signs (recording them would add a write to every send).

A session that says it ended (``IRegistry.leave``: ``POST /agent/leave``, which Claude Code's hook
waiter sends when the Claude Code process exits) is ``gone`` at once, until its next sign.
"""

from __future__ import annotations

from typing import Final

from broker.limits import MAX_NOTICE_WAIT_SECONDS

PRESENCE_WINDOW_MS: Final = int(MAX_NOTICE_WAIT_SECONDS * 1000) + 60_000
"""An agent seen within this long (the longest wait, plus a minute for the next one to start) is
``live``; longer ago, ``gone``."""

LIVE: Final = "live"
GONE: Final = "gone"
PRESENCES: Final = (LIVE, GONE)


def presence(last_seen_ms: int | None, now_ms: int, ended_at_ms: int | None = None) -> str:
    """``live`` when the agent gave a sign within ``PRESENCE_WINDOW_MS`` of ``now_ms`` and its session
    did not say it ended since (``ended_at_ms``, ``IRegistry.leave``), else ``gone``; every time is
    the store's clock (ms)."""
    if last_seen_ms is None or (ended_at_ms is not None and ended_at_ms >= last_seen_ms):
        return GONE
    return LIVE if now_ms - last_seen_ms <= PRESENCE_WINDOW_MS else GONE
