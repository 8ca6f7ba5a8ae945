"""Typed agent addresses.

An address is a provider's type: the type alone fixes the tier a message to or from it travels. The
concrete provider types live in ``adapters.providers``; the core only knows the shape every address
shares and how to look a provider up by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self

from broker.envelope import Tier
from broker.errors import InvalidAddress


@dataclass(frozen=True, slots=True)
class Address:
    """Base of every provider's address type. Subclasses set ``provider`` and ``tier`` and override
    ``parse`` to refuse endpoints that do not belong to them."""

    endpoint: str
    provider: ClassVar[str] = ""
    tier: ClassVar[Tier] = Tier.NETWORK

    @classmethod
    def parse(cls, endpoint: str) -> Self:
        return cls(endpoint)


class Providers:
    """The provider names a relay accepts, each bound to its address type."""

    def __init__(self, types: Iterable[type[Address]]) -> None:
        self._types: dict[str, type[Address]] = {}
        for kind in types:
            if not kind.provider or kind.provider in self._types:
                raise ValueError(f"provider name {kind.provider!r} is empty or taken")
            self._types[kind.provider] = kind

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._types))

    def types(self) -> Mapping[str, type[Address]]:
        return dict(self._types)

    def parse(self, provider: object, endpoint: object) -> Address:
        """Build the typed address or raise ``InvalidAddress`` naming the field and the rule."""
        if not isinstance(provider, str) or provider not in self._types:
            raise InvalidAddress(
                "provider",
                "provider.known",
                f"unknown provider {provider!r}; use one of: {', '.join(self.names)}",
            )
        if not isinstance(endpoint, str) or not endpoint:
            raise InvalidAddress("endpoint", "endpoint.required", "an endpoint is required")
        if len(endpoint) > 2048:
            raise InvalidAddress("endpoint", "endpoint.max_len", "must be at most 2048 characters")
        return self._types[provider].parse(endpoint)
