"""Contact policies: whom a recipient accepts messages from (docs/policy.md).

A recipient's policy is one of three (``ACCEPT_FROM``):

- ``open`` (the default, for an agent that never set one): every registered sender.
- ``registered``: senders with a registration: agents, and people (provider ``human``).
- a list of agent ids: only those senders. People are accepted only when the list names them.

``accepts`` is the rule; the memory backend applies it in Python and the Redis backend in
``adapters/redis/lua/send_append.lua``, atomically with the append on the recipient's slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from broker.errors import InvalidArgument
from broker.ids import check_agent_id
from broker.limits import MAX_POLICY_AGENTS

OPEN: Final = "open"
REGISTERED: Final = "registered"
LIST: Final = "list"
ACCEPT_FROM: Final = (OPEN, REGISTERED, LIST)
"""The kinds of policy, as ``ContactPolicy.accept_from`` spells them."""


@dataclass(frozen=True, slots=True)
class ContactPolicy:
    """Whom one recipient accepts messages from. ``agents`` is empty unless ``accept_from`` is
    ``list``; then it holds 1..``MAX_POLICY_AGENTS`` checked agent ids."""

    accept_from: str = OPEN
    agents: frozenset[str] = frozenset()

    def accepts(self, sender: str, provider: str | None) -> bool:
        """True when a message from ``sender``, registered with ``provider`` (None: no registration),
        is accepted. People are accepted like agents, except by a list that does not name them."""
        if self.accept_from == LIST:
            return sender in self.agents
        if self.accept_from == REGISTERED:
            return provider is not None
        return True

    def describe(self) -> str:
        """One line for people: ``open``, ``registered``, or ``list of N: a, b, ...`` (sorted)."""
        if self.accept_from != LIST:
            return self.accept_from
        return f"list of {len(self.agents)}: {', '.join(sorted(self.agents))}"

    def as_json(self) -> dict[str, object]:
        data: dict[str, object] = {"accept_from": self.accept_from}
        if self.accept_from == LIST:
            data["agents"] = sorted(self.agents)
        return data


DEFAULT_POLICY: Final = ContactPolicy()


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """A policy as the dashboard lists it: its kind and how many ids its list names (0 unless list)."""

    accept_from: str = OPEN
    listed: int = 0

    @property
    def label(self) -> str:
        return f"list ({self.listed})" if self.accept_from == LIST else self.accept_from


def listing(ids: Iterable[object], field: str = "accept_from") -> ContactPolicy:
    """The ``list`` policy of ``ids``: each a valid agent id (the refusal names its position), at most
    ``MAX_POLICY_AGENTS`` distinct ones, at least one; duplicates count once."""
    agents: set[str] = set()
    for i, value in enumerate(ids):
        try:
            agents.add(check_agent_id(value, f"{field}[{i}]"))
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"{field}[{i}]", exc.violation.rule, f"{exc.violation.message}; nothing was changed"
            ) from None
        if len(agents) > MAX_POLICY_AGENTS:
            raise InvalidArgument(
                field,
                "accept_from.max_agents",
                f"a list names at most {MAX_POLICY_AGENTS} agent ids, and this one names more; use "
                f"'{REGISTERED}' or '{OPEN}' for a wider circle (nothing was changed)",
            )
    if not agents:
        raise InvalidArgument(
            field, "accept_from.empty", "the list names no agent id; name at least one (nothing was changed)"
        )
    return ContactPolicy(LIST, frozenset(agents))


def parse_accept_from(text: str, field: str = "--accept-from") -> ContactPolicy:
    """``open``, ``registered``, or a comma-separated list of agent ids (``relay policy set``; spaces
    around an id are dropped). A one-id list that spells ``open`` or ``registered`` is written twice
    (``open,open``)."""
    if text in (OPEN, REGISTERED):
        return ContactPolicy(text)
    if len(text) > (MAX_POLICY_AGENTS + 1) * 65:
        raise InvalidArgument(
            field,
            "accept_from.max_agents",
            f"is {len(text)} characters long: a list names at most {MAX_POLICY_AGENTS} agent ids "
            f"(nothing was changed)",
        )
    return listing([part.strip(" ") for part in text.split(",")], field)
