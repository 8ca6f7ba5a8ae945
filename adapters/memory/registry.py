"""``MemoryRegistry``: registrations in process memory, the reference semantics of ``IRegistry``."""

from __future__ import annotations

from dataclasses import replace

from adapters.memory.state import MemoryInbox, MemoryState
from broker.addresses import Address
from broker.envelope import now_ms
from broker.errors import UnregisteredAgent
from broker.ports import SUPERSEDED_SESSIONS_KEPT, RegisterOutcome, Registration, Retired


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
        self.state.check_retired(agent, session)
        previous = self.state.registrations.get(agent)
        retired = self.state.retired.pop(agent, None)
        if retired is not None:  # a new session takes the id again: the retired ones are superseded
            self.state.superseded[agent] = list(retired[1][:SUPERSEDED_SESSIONS_KEPT])
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
        self.state.ended.pop(agent, None)
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

    async def leave(self, agent: str, session: str) -> bool:
        registration = self.state.registrations.get(agent)
        if registration is None or registration.session != session:
            return False
        self.state.ended[agent] = now_ms()
        return True

    async def retire(self, agent: str, *, purge: bool = False) -> Retired:
        state = self.state
        registration = state.registrations.pop(agent, None)
        if registration is not None:
            sessions = (registration.session, *state.superseded.pop(agent, ()))
            state.retired[agent] = (now_ms(), sessions[: SUPERSEDED_SESSIONS_KEPT + 1])
            state.webhook_secrets.pop(agent, None)
            state.notices.pop(agent, None)
            state.seen.pop(agent, None)
            state.ended.pop(agent, None)
            inbox = state.inboxes.get(agent)
            if inbox is not None:
                await inbox.wake()  # its parked fetches and waits look again and are refused
        elif agent not in state.retired:
            raise UnregisteredAgent(agent)
        purged = 0
        if purge:
            purged = state.purge(agent)
            state.dead.pop(agent, None)
            state.history.pop(agent, None)
            state.history_bytes.pop(agent, None)
            state.counts.pop(agent, None)
        return Retired(agent, state.retired[agent][1], registration is not None, purged)
