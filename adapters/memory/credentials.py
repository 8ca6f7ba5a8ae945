"""``MemoryCredentials``: per-agent credentials (``broker.ports.ICredentials``) in this process's
memory, the reference semantics."""

from __future__ import annotations

from broker.credentials import EVENTS, Credential, CredentialEvent


class MemoryCredentials:
    def __init__(self) -> None:
        self._records: dict[str, Credential] = {}
        self._events: dict[CredentialEvent, int] = dict.fromkeys(EVENTS, 0)

    async def add(self, credential: Credential) -> None:
        if credential.id in self._records:
            raise ValueError(f"credential {credential.id} already exists")
        self._records[credential.id] = credential
        self._events["issued"] += 1

    async def get(self, credential_id: str) -> Credential | None:
        return self._records.get(credential_id)

    async def listed(self, agent: str | None = None) -> list[Credential]:
        found = [c for c in self._records.values() if agent is None or c.agent == agent]
        return sorted(found, key=lambda c: (c.created_at_ms, c.id))

    async def revoke(self, credential_id: str, at_ms: int) -> Credential | None:
        record = self._records.get(credential_id)
        if record is None:
            return None
        if not record.revoked:
            record = self._records[credential_id] = record.revoked_at(at_ms)
            self._events["revoked"] += 1
        return record

    async def used(self, credential_id: str, at_ms: int) -> None:
        record = self._records.get(credential_id)
        if record is not None:
            self._records[credential_id] = record.used_at(at_ms)
            self._events["exchanged"] += 1

    async def count(self, event: CredentialEvent) -> None:
        self._events[event] += 1

    async def events(self) -> dict[CredentialEvent, int]:
        return dict(self._events)
