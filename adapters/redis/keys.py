"""Every Redis key name relay uses, built in one place (see docs/redis-layout.md).

Agent ids are checked against ``broker.ids.AGENT_ID_PATTERN`` before they reach this module, so a key
can never be injected. The ``{agent}`` hash tag keeps an agent's keys in one cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "relay"
"""The consumer group of every inbox stream."""

DEFAULT_PREFIX = "relay"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    def registration(self, agent: str) -> str:
        """Hash: provider, endpoint, tier, session, registered_at, updated_at."""
        return f"{self.prefix}:agent:{{{agent}}}"

    def inbox(self, agent: str) -> str:
        """Stream of unacknowledged envelopes, consumer group ``GROUP``."""
        return f"{self.prefix}:inbox:{{{agent}}}"

    def dead_letters(self, agent: str) -> str:
        """Stream of envelopes that failed delivery too often."""
        return f"{self.prefix}:dead:{{{agent}}}"

    def rate(self, agent: str) -> str:
        """String: the sender's rate-limit state."""
        return f"{self.prefix}:rate:{{{agent}}}"

    def agents(self) -> str:
        """Set of every registered agent id (for listing and inspection)."""
        return f"{self.prefix}:agents"

    def pattern(self) -> str:
        """A SCAN pattern matching every relay key."""
        return f"{self.prefix}:*"
