"""Checks shared by the fault and load tests: a fetched envelope is whole, and so is every stored entry."""

from __future__ import annotations

import re
from typing import Any

import redis.asyncio as aioredis

from broker.ids import ENVELOPE_ID_PATTERN

ENVELOPE_FIELDS = {"from", "tier", "sent_at", "kind", "text", "nonce"}


def check_envelope(envelope: dict[str, Any]) -> tuple[str, int]:
    """A fetched envelope is whole: id, sender, tier, kind and a text naming its sender and number."""
    assert re.fullmatch(ENVELOPE_ID_PATTERN, envelope["id"]), envelope
    assert envelope["tier"] == "host" and envelope["message"]["kind"] == 1, envelope
    match = re.fullmatch(r"from (\S+) #(\d+)", envelope["message"]["text"])
    assert match is not None and match.group(1) == envelope["from"], envelope
    return envelope["from"], int(match.group(2))


async def check_stored_entries(store: aioredis.Redis, pattern: str) -> int:
    """Every stream entry in Redis carries the complete envelope field set (nothing half-written)."""
    count = 0
    async for key in store.scan_iter(pattern, count=1000):
        entries: list[tuple[str, dict[str, str]]] = await store.xrange(key)  # type: ignore[assignment]
        for _entry_id, fields in entries:
            assert set(fields) == ENVELOPE_FIELDS, (key, fields)
            count += 1
    return count
