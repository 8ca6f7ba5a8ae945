"""Conformance of a spent-token store (``broker.ports.ISpentTokens``).

Subclass ``SpentTokensConformance`` and implement ``make_stores``: ``count`` stores over one fresh
backend, as the workers of one relay hold them (the memory twin: one object, handed out ``count``
times). That a restart forgets nothing is the Redis twin's own test (the memory twin lives as long
as its object).
"""

from __future__ import annotations

import asyncio
import secrets
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager

from broker.ports import ISpentTokens

HOUR_MS = 3_600_000


class SpentTokensConformance(ABC):
    @abstractmethod
    def make_stores(self, count: int) -> AbstractAsyncContextManager[list[ISpentTokens]]:
        """``count`` stores over one fresh backend (like workers on one Redis)."""

    async def test_an_id_is_spent_once(self) -> None:
        async with self.make_stores(1) as (store,):
            token = secrets.token_urlsafe(16)
            assert await store.spend(token, HOUR_MS)
            assert not await store.spend(token, HOUR_MS)
            assert not await store.spend(token, HOUR_MS)
            assert await store.spend(secrets.token_urlsafe(16), HOUR_MS)  # ids are independent

    async def test_every_worker_sees_a_spend(self) -> None:
        async with self.make_stores(2) as (a, b):
            token = secrets.token_urlsafe(16)
            assert await a.spend(token, HOUR_MS)
            assert not await b.spend(token, HOUR_MS)

    async def test_concurrent_spends_of_one_id_let_one_through(self) -> None:
        async with self.make_stores(2) as (a, b):
            token = secrets.token_urlsafe(16)
            answers = await asyncio.gather(*(store.spend(token, HOUR_MS) for store in (a, b) * 8))
            assert sorted(answers) == [False] * 15 + [True]

    async def test_any_text_is_an_id(self) -> None:
        async with self.make_stores(1) as (store,):
            for token in ("", "{slot}", "a:b*c", "\u202e\n\x00", "x" * 4096):
                assert await store.spend(token, HOUR_MS), token
                assert not await store.spend(token, HOUR_MS), token
