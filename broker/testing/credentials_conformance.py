"""Conformance of a credential store (``broker.ports.ICredentials``).

Subclass ``CredentialsConformance`` and implement ``make_stores``: ``count`` stores over one fresh
backend, as the workers of one relay and the ``relay credentials`` command hold them (the memory twin:
one object, handed out ``count`` times).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import pytest

from broker.credentials import EVENTS, hash_secret, new_credential, split
from broker.ports import ICredentials

NOW_MS = 1_800_000_000_000


class CredentialsConformance(ABC):
    @abstractmethod
    def make_stores(self, count: int) -> AbstractAsyncContextManager[list[ICredentials]]:
        """``count`` stores over one fresh backend (like workers on one Redis)."""

    async def test_a_credential_is_kept_as_a_hash_and_found_by_its_id(self) -> None:
        async with self.make_stores(2) as (a, b):
            record, text = new_credential("alice", label="laptop", now_ms=NOW_MS, expires_in_s=60)
            await a.add(record)
            found = await b.get(record.id)
            assert found == record
            parts = split(text)
            assert parts is not None and parts[0] == record.id
            assert found is not None and found.matches(parts[1]) and not found.matches(parts[1][:-1] + "x")
            assert found.secret_hash == hash_secret(parts[1]) and parts[1] not in repr(found)
            assert found.expires_at_ms == NOW_MS + 60_000 and not found.revoked

    async def test_an_unknown_id_is_none_and_changes_nothing(self) -> None:
        async with self.make_stores(1) as (store,):
            for ident in ("cr_aaaaaaaaaaaaaaaaaaaa", "", "{slot}", "cr_*", "x" * 500):
                assert await store.get(ident) is None
                assert await store.revoke(ident, NOW_MS) is None
                await store.used(ident, NOW_MS)
            assert await store.listed() == []
            assert await store.events() == dict.fromkeys(EVENTS, 0)

    async def test_an_id_is_added_once(self) -> None:
        async with self.make_stores(1) as (store,):
            record, _ = new_credential("alice", now_ms=NOW_MS)
            await store.add(record)
            with pytest.raises(ValueError, match="already exists"):
                await store.add(replace(record, agent="mallory", secret_hash=hash_secret("x")))
            assert await store.get(record.id) == record
            assert await store.listed("mallory") == []

    async def test_listing_is_per_agent_oldest_first(self) -> None:
        async with self.make_stores(1) as (store,):
            first, _ = new_credential("alice", now_ms=NOW_MS)
            second, _ = new_credential("alice", audience="network", now_ms=NOW_MS + 1)
            other, _ = new_credential("bob", now_ms=NOW_MS - 5)
            for record in (second, other, first):
                await store.add(record)
            assert await store.listed("alice") == [first, second]
            assert await store.listed("bob") == [other]
            assert await store.listed("carol") == []
            assert await store.listed() == [other, first, second]

    async def test_revoking_keeps_the_first_time_and_counts_once(self) -> None:
        async with self.make_stores(2) as (a, b):
            record, _ = new_credential("alice", now_ms=NOW_MS)
            await a.add(record)
            revoked = await b.revoke(record.id, NOW_MS + 10)
            assert revoked is not None and revoked.revoked_at_ms == NOW_MS + 10
            again = await a.revoke(record.id, NOW_MS + 20)
            assert again is not None and again.revoked_at_ms == NOW_MS + 10
            assert (await a.get(record.id)) == revoked
            assert (await a.events())["revoked"] == 1

    async def test_a_use_is_recorded_and_never_undoes_a_revocation(self) -> None:
        async with self.make_stores(2) as (a, b):
            record, _ = new_credential("alice", now_ms=NOW_MS)
            await a.add(record)
            await b.used(record.id, NOW_MS + 5)
            used = await a.get(record.id)
            assert used is not None and used.last_used_at_ms == NOW_MS + 5
            await asyncio.gather(
                *(b.used(record.id, NOW_MS + 6 + n) for n in range(8)), a.revoke(record.id, NOW_MS + 7)
            )
            final = await a.get(record.id)
            assert final is not None and final.revoked and final.revoked_at_ms == NOW_MS + 7

    async def test_events_are_counted_across_stores(self) -> None:
        async with self.make_stores(2) as (a, b):
            record, _ = new_credential("alice", now_ms=NOW_MS)
            await a.add(record)
            await b.used(record.id, NOW_MS)
            await a.count("refused")
            await b.count("refused")
            await b.revoke(record.id, NOW_MS)
            assert await a.events() == {"issued": 1, "exchanged": 1, "revoked": 1, "refused": 2}
