"""``MemorySpentTokens``: spent single-use token ids (``broker.ports.ISpentTokens``) in this process's
memory, the reference semantics: every user of one object shares its record."""

from __future__ import annotations

import time


class MemorySpentTokens:
    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        """Token id -> monotonic time it is forgotten at."""

    async def spend(self, token_id: str, ttl_ms: int) -> bool:
        now = time.monotonic()
        # Pruned on every spend: ids live at most as long as the longest token, so the record stays
        # as small as the logins of that span.
        self._until = {known: until for known, until in self._until.items() if until > now}
        if token_id in self._until:
            return False
        self._until[token_id] = now + max(1, ttl_ms) / 1000
        return True
