"""The agents overview the dashboard serves, read at most once a second for every viewer.

Every open agents page polls; all of them share one read of the operator view (single-flight, kept
``max_age`` seconds), so the load on the store does not grow with the number of viewers, and each
viewer gets one page of rows sorted and cut here (the browser never holds more than a page).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from broker.policy import PolicySummary
from broker.ports import AgentOverview, IOperatorView, IPolicyStore
from broker.presence import presence

DEFAULT_MAX_AGE: Final = 1.0
MAX_AGENTS: Final = 20_000
"""Agents the overview reads at most (the store's registrations beyond are counted, not shown)."""
PAGE: Final = 5000
"""Agents asked of the operator view per call (one directory listing each)."""
MAX_PAGE_ROWS: Final = 500
BACKLOG_WARN: Final = 100
BACKLOG_ALERT: Final = 1000
"""Inbox depths the page highlights (amber from the first, red from the second)."""
AGE_WARN_SECONDS: Final = 60
AGE_ALERT_SECONDS: Final = 600
"""Ages of the oldest unacknowledged envelope the page highlights."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    rows: list[dict[str, object]]
    total: int
    now_ms: int
    read_at: float


def _row(agent: AgentOverview, now_ms: int, policy: PolicySummary) -> dict[str, object]:
    def age(ms: int | None) -> float | None:
        return None if ms is None else max(0.0, (now_ms - ms) / 1000)

    return {
        "agent": agent.agent,
        "provider": agent.provider,
        "tier": agent.tier.label if agent.tier is not None else None,
        "session": agent.session,
        "depth": agent.inbox_depth,
        "pending": agent.pending,
        "oldest": age(agent.oldest_unacked_ms),
        "dead": agent.dead_letters,
        "last_seen": age(agent.last_seen_ms),
        "presence": presence(agent.last_seen_ms, now_ms, agent.ended_at_ms),
        "policy": policy.label,
    }


def _sort_key(name: str) -> Callable[[dict[str, object]], tuple[bool, object]]:
    """Rows by column ``name``, unknown (None) values last."""

    def key(row: dict[str, object]) -> tuple[bool, object]:
        value = row[name]
        return (value is None, value if value is not None else 0)

    return key


SORT_KEYS: Final = {
    name: _sort_key(name)
    for name in (
        "agent",
        "provider",
        "tier",
        "session",
        "depth",
        "pending",
        "oldest",
        "dead",
        "last_seen",
        "policy",
    )
}


class Overview:
    """``policies``: where each agent's contact policy is read (one summary per agent, no list), for
    the ``policy`` column; without it every agent reads ``open``."""

    def __init__(
        self, view: IOperatorView, max_age: float = DEFAULT_MAX_AGE, *, policies: IPolicyStore | None = None
    ) -> None:
        self.view = view
        self.policies = policies
        self.max_age = max_age
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self) -> Snapshot:
        async with self._lock:
            current = self._snapshot
            if current is not None and time.monotonic() - current.read_at < self.max_age:
                return current
            rows: list[dict[str, object]] = []
            after: str | None = None
            total, now_ms = 0, 0
            while len(rows) < MAX_AGENTS:
                page = await self.view.agents(limit=PAGE, after=after)
                total, now_ms = max(total, page.total), page.now_ms
                shown = [agent for agent in page.agents if agent.registered]
                policies = (
                    await self.policies.summaries([a.agent for a in shown])
                    if self.policies is not None
                    else [PolicySummary()] * len(shown)
                )
                rows.extend(_row(a, page.now_ms, p) for a, p in zip(shown, policies, strict=True))
                if len(page.agents) < PAGE:
                    break
                after = page.agents[-1].agent
            self._snapshot = Snapshot(rows, max(total, len(rows)), now_ms, time.monotonic())
            return self._snapshot

    def forget(self) -> None:
        """Read again on the next request (after a send or a requeue from the dashboard)."""
        self._snapshot = None

    async def page(
        self, sort: str, descending: bool, offset: int, limit: int, prefix: str
    ) -> dict[str, object]:
        snap = await self.snapshot()
        rows = [r for r in snap.rows if str(r["agent"]).startswith(prefix)] if prefix else snap.rows
        key = SORT_KEYS.get(sort, SORT_KEYS["agent"])
        if descending:
            # None (unknown) last either way
            known = sorted((r for r in rows if key(r)[0] is False), key=key, reverse=True)
            ordered = known + [r for r in rows if key(r)[0] is True]
        else:
            ordered = sorted(rows, key=key)
        limit = max(1, min(limit, MAX_PAGE_ROWS))
        offset = max(0, offset)
        return {
            "agents": ordered[offset : offset + limit],
            "matched": len(rows),
            "total": snap.total,
            "offset": offset,
            "limit": limit,
            "now_ms": snap.now_ms,
            "totals": {
                "depth": sum(int(str(r["depth"])) for r in snap.rows),
                "pending": sum(int(str(r["pending"])) for r in snap.rows),
                "dead": sum(int(str(r["dead"])) for r in snap.rows),
            },
            "thresholds": {
                "depth": [BACKLOG_WARN, BACKLOG_ALERT],
                "oldest": [AGE_WARN_SECONDS, AGE_ALERT_SECONDS],
            },
        }

    async def agent(self, agent: str) -> dict[str, object] | None:
        snap = await self.snapshot()
        return next((r for r in snap.rows if r["agent"] == agent), None)
