"""The relay's contract: the one message type it carries, how it is validated and encoded.

A ``Contract[Body]`` is what makes ``Relay[Body]`` generic: the relay never looks inside a body; it
asks the contract to validate it and to turn it into flat string fields (readable in Redis) and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

Body = TypeVar("Body")

RESERVED_FIELDS = frozenset({"from", "tier", "sent_at", "expires_at", "nonce", "to", "id", "requeued_from"})
"""Field names the envelope itself uses; a contract's ``to_fields`` must not produce them."""


class Contract(Protocol[Body]):
    """Validation and encoding of one body type.

    Implementations are stateless after construction and safe to share between tasks.
    """

    @property
    def type_name(self) -> str:
        """The fully qualified name of the body type, e.g. ``candace.agent.v1.AgentMessage``."""
        ...

    def validate(self, body: Body) -> None:
        """Check every refinement of the contract.

        Raises:
            ContractViolation: listing every violation (field path, rule id, message).
        """
        ...

    def to_fields(self, body: Body) -> dict[str, str]:
        """Flat, human-readable fields of a valid body; never uses ``RESERVED_FIELDS``."""
        ...

    def from_fields(self, fields: Mapping[str, str]) -> Body:
        """Inverse of ``to_fields``.

        Raises:
            ContractViolation: if the fields do not describe a body (a corrupt store entry).
        """
        ...

    def to_json(self, body: Body) -> dict[str, object]:
        """The body as plain JSON data (what MCP tools return)."""
        ...

    def from_json(self, data: object) -> Body:
        """Parse JSON data (what MCP tools receive) without validating refinements.

        Raises:
            ContractViolation: if ``data`` has the wrong shape (unknown field, wrong type).
        """
        ...
