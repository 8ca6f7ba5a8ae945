"""``MemoryPolicyStore``: contact policies (``broker.ports.IPolicyStore``) in a ``MemoryState``, which
``MemoryInboxStore.append`` checks in the same step as the append (one event loop: nothing runs
between the check and the write)."""

from __future__ import annotations

from collections.abc import Sequence

from adapters.memory.state import MemoryStore
from broker.policy import DEFAULT_POLICY, LIST, ContactPolicy, PolicySummary


class MemoryPolicyStore(MemoryStore):
    async def get(self, agent: str) -> ContactPolicy:
        return self.state.policies.get(agent, DEFAULT_POLICY)

    async def set(self, agent: str, policy: ContactPolicy) -> ContactPolicy:
        old = self.state.policies.get(agent, DEFAULT_POLICY)
        if policy == DEFAULT_POLICY:
            self.state.policies.pop(agent, None)
        else:
            self.state.policies[agent] = policy
        return old

    async def summaries(self, agents: Sequence[str]) -> list[PolicySummary]:
        found = [self.state.policies.get(agent, DEFAULT_POLICY) for agent in agents]
        return [PolicySummary(p.accept_from, len(p.agents) if p.accept_from == LIST else 0) for p in found]
