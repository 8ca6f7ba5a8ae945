"""``MemoryRegistry``: registrations in process memory, the reference semantics of ``IRegistry``."""

from __future__ import annotations

from dataclasses import replace

from adapters.memory.state import MemoryInbox, MemoryState
from broker.addresses import Address
from broker.envelope import now_ms
from broker.ports import SUPERSEDED_SESSIONS_KEPT, RegisterOutcome, Registration


class MemoryRegistry:
    def __init__(self, state: MemoryState | None = None) -> None:
        self.state = state if state is not None else MemoryState()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    @property
    def backend(self) -> MemoryRegistry:
        return self

    async def register(self, agent: str, address: Address, session: str) -> RegisterOutcome:
        now = now_ms()
        previous = self.state.registrations.get(agent)
        if previous is None:
            registration = Registration(
                agent=agent,
                provider=address.provider,
                endpoint=address.endpoint,
                tier=address.tier,
                session=session,
                registered_at_ms=now,
                updated_at_ms=now,
            )
        else:
            registration = replace(
                previous,
                provider=address.provider,
                endpoint=address.endpoint,
                tier=address.tier,
                session=session,
                updated_at_ms=now,
            )
        self.state.registrations[agent] = registration
        self.state.webhook_secrets.pop(agent, None)
        self.state.inboxes.setdefault(agent, MemoryInbox())
        self.state.seen[agent] = now
        superseded = previous.session if previous is not None and previous.session != session else None
        if superseded is not None:
            earlier = [s for s in self.state.superseded.get(agent, ()) if s not in (session, superseded)]
            self.state.superseded[agent] = [superseded, *earlier][:SUPERSEDED_SESSIONS_KEPT]
            await self.state.inboxes[agent].wake()  # its parked fetches look again and are refused
        return RegisterOutcome(registration, previous is None, superseded)

    async def get(self, agent: str) -> Registration | None:
        return self.state.registration(agent)

    async def list(self, limit: int = 1000, after: str | None = None) -> list[Registration]:
        agents = [a for a in sorted(self.state.registrations) if after is None or a > after][:limit]
        return [r for r in map(self.state.registration, agents) if r is not None]
