"""Typed agent addresses: the provider types and the rules of their endpoints.

An address is a provider's type: the type alone fixes the tier a message to or from it travels
(``workbench`` in-process, ``claudecode`` host, ``human`` host: a person at the shell or the dashboard,
``remote`` network). ``Providers`` is the set of
provider names a front accepts; ``parse`` refuses an endpoint its provider's type does not admit.

Every endpoint is printable (``check_printable``: no control, line or format characters, so a stored
endpoint can never forge an output line or drive a terminal) and unambiguous: an IPv6 host is written
in brackets (``[::1]:80``; ``::1:80`` is refused, as it also reads as the address ``::1:80``), and an
IPv6 scope id is an interface name (letters, digits, ``.``, ``_``, ``-``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Final, Self
from urllib.parse import urlsplit

from broker.envelope import Tier
from broker.errors import InvalidAddress
from broker.ids import SESSION_ID_PATTERN


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
        check_printable(endpoint)
        return self._types[provider].parse(endpoint)


def check_printable(endpoint: str) -> None:
    """Refuse an endpoint holding a character that is not printable, naming the first one."""
    if endpoint.isprintable():
        return
    at, char = next((i, c) for i, c in enumerate(endpoint) if not c.isprintable())
    raise InvalidAddress(
        "endpoint",
        "endpoint.printable",
        f"{endpoint[:80]!r} holds the non-printable character U+{ord(char):04X} at position {at}: an "
        "endpoint may hold no control, line-break or format characters",
    )


_SESSION_RE: Final = re.compile(SESSION_ID_PATTERN)
_HOSTNAME_RE: Final = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_AUTHORITY_RE: Final = re.compile(r"(\[[0-9A-Fa-f:.]+(%[A-Za-z0-9._~%-]+)?\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?")
_NUMERIC_LABEL_RE: Final = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_UNIX_PATH_MAX: Final = 107  # sun_path holds 108 bytes including the terminating NUL
_SCOPE_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class WorkbenchAddress(Address):
    """An in-process Workbench session; the endpoint names that session."""

    provider: ClassVar[str] = "workbench"
    tier: ClassVar[Tier] = Tier.IN_PROCESS

    @classmethod
    def parse(cls, endpoint: str) -> Self:
        if _SESSION_RE.fullmatch(endpoint) is None:
            raise InvalidAddress(
                "endpoint",
                "workbench.session",
                f"{endpoint!r} is not a Workbench session name: use 1-128 ASCII letters, digits, "
                "'.', '_' or '-'",
            )
        return cls(endpoint)


@dataclass(frozen=True, slots=True)
class ClaudeCodeAddress(Address):
    """A Claude Code session on this host: a loopback ``host:port`` or ``unix:/absolute/path``."""

    provider: ClassVar[str] = "claudecode"
    tier: ClassVar[Tier] = Tier.HOST

    @classmethod
    def parse(cls, endpoint: str) -> Self:
        check_printable(endpoint)
        if endpoint.startswith("unix:"):
            path = endpoint[5:]
            if not path.startswith("/") or "\x00" in path or len(path.encode()) > _UNIX_PATH_MAX:
                raise InvalidAddress(
                    "endpoint",
                    "claudecode.unix_path",
                    f"{endpoint!r}: a unix endpoint is 'unix:' followed by an absolute path of at most "
                    f"{_UNIX_PATH_MAX} bytes",
                )
            return cls(endpoint)
        host, port = _split_host_port(endpoint)
        _check_unambiguous(endpoint, host, port)
        if host is None or port is None or not is_loopback_host(host):
            raise InvalidAddress(
                "endpoint",
                "claudecode.loopback",
                f"{endpoint!r} is not a host-tier endpoint: use 127.0.0.1:PORT (any 127.0.0.0/8), "
                "[::1]:PORT, localhost:PORT or unix:/absolute/path",
            )
        return cls(endpoint)


@dataclass(frozen=True, slots=True)
class RemoteAddress(Address):
    """An agent on another machine: a non-loopback ``host:port`` or an ``https://`` URL.

    An ``https://`` URL is where webhook notifications go; its host may be any name or address here,
    because where a notification may go is decided on every delivery, after DNS resolution (loopback and
    private addresses only with ``relay serve --webhook-allow-private``)."""

    provider: ClassVar[str] = "remote"
    tier: ClassVar[Tier] = Tier.NETWORK

    @classmethod
    def parse(cls, endpoint: str) -> Self:
        check_printable(endpoint)
        host: str | None
        if endpoint.startswith("https://"):
            try:
                parts = urlsplit(endpoint)
                host = parts.hostname
                port = parts.port
            except ValueError:
                host = port = None
            # The authority is exactly a host and an optional port: no user, no stray brackets or
            # colons, the port in 1..65535 (HTTP clients refuse the rest at every delivery).
            if _AUTHORITY_RE.fullmatch(parts.netloc if host is not None else "") is None or port == 0:
                host = None
            if host is not None and ":" in host:
                host = f"[{host}]"
        else:
            host, port = _split_host_port(endpoint)
            _check_unambiguous(endpoint, host, port)
            if port is None:
                host = None
        if host is not None:
            _check_ipv4_form(endpoint, host)
        loopback = host is not None and is_loopback_host(host) and not endpoint.startswith("https://")
        if host is None or not _is_host(host) or loopback or _is_unspecified(host):
            raise InvalidAddress(
                "endpoint",
                "remote.network",
                f"{endpoint!r} is not a network endpoint: use a non-loopback host:port or an https:// URL",
            )
        return cls(endpoint)


HUMAN_SESSION: Final = "shell"
"""The session a person's id is registered and sends from, by every front (``relay send``, the
dashboard): one value, so a person registered by one front sends from the other."""


@dataclass(frozen=True, slots=True)
class HumanAddress(Address):
    """A person on this host (``relay send``, the dashboard); the endpoint is a label for them, e.g.
    their login name. Host tier: people reach relay through its loopback listener."""

    provider: ClassVar[str] = "human"
    tier: ClassVar[Tier] = Tier.HOST

    @classmethod
    def parse(cls, endpoint: str) -> Self:
        if _SESSION_RE.fullmatch(endpoint) is None:
            raise InvalidAddress(
                "endpoint",
                "human.label",
                f"{endpoint!r} is not a label for a person: use 1-128 ASCII letters, digits, '.', '_' or '-'",
            )
        return cls(endpoint)


def default_providers() -> Providers:
    """The providers relay accepts out of the box."""
    return Providers([WorkbenchAddress, ClaudeCodeAddress, HumanAddress, RemoteAddress])


def host_providers() -> Providers:
    """What the agent MCP endpoint accepts: host-tier agent addresses only. ``human`` is not one of
    them: people are registered by the fronts made for them (``relay send``, the dashboard), never by
    an agent's call."""
    return Providers([ClaudeCodeAddress])


def network_providers() -> Providers:
    """What the agent MCP endpoint of the network listener accepts: network-tier addresses only."""
    return Providers([RemoteAddress])


def _split_host_port(endpoint: str) -> tuple[str | None, int | None]:
    if endpoint.startswith("["):
        close = endpoint.find("]")
        if close < 0 or endpoint[close + 1 : close + 2] != ":":
            return None, None
        host, port_text = endpoint[: close + 1], endpoint[close + 2 :]
    else:
        host, sep, port_text = endpoint.rpartition(":")
        if not sep or not host:
            return None, None
    if not port_text.isdigit() or not port_text.isascii() or not 1 <= int(port_text) <= 65535:
        return host, None
    return host, int(port_text)


def _check_unambiguous(endpoint: str, host: str | None, port: int | None) -> None:
    """Refuse an unbracketed IPv6 host (``::1:80``) and an IPv6 scope id that is not an interface name."""
    if host is None:
        return
    if not host.startswith("[") and ":" in host:
        where = f"[{host}]:{port}" if port is not None else f"[{host}]:PORT"
        raise InvalidAddress(
            "endpoint",
            "endpoint.ipv6_brackets",
            f"{endpoint!r} is ambiguous: write an IPv6 host in brackets, e.g. {where}",
        )
    _, percent, scope = host.partition("%")
    if percent and _SCOPE_ID_RE.fullmatch(scope.removesuffix("]")) is None:
        raise InvalidAddress(
            "endpoint",
            "endpoint.ipv6_scope",
            f"{endpoint!r}: an IPv6 scope id is an interface name (1-64 letters, digits, '.', '_', '-')",
        )


def _check_ipv4_form(endpoint: str, host: str) -> None:
    """Refuse a host that URL parsers and resolvers read as an IPv4 address (its last label is a
    number) unless it is written in the usual dotted form: ``0177.0.0.1``, ``127.000.000.001``,
    ``0x7f.1``, ``127.1`` and ``2130706433`` are all 127.0.0.1 to someone, and a rule on the
    address must see the address."""
    if host.startswith("[") or _NUMERIC_LABEL_RE.fullmatch(host.rpartition(".")[2]) is None:
        return
    try:
        ipaddress.IPv4Address(host)  # four decimal parts, no leading zeros
    except ValueError:
        raise InvalidAddress(
            "endpoint",
            "endpoint.ipv4_form",
            f"{endpoint[:80]!r}: {host[:64]!r} reads as an IPv4 address; write it as four decimal "
            "numbers 0-255 without leading zeros (e.g. 127.0.0.1), or use a host name",
        ) from None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``host`` spells (an IPv4-mapped IPv6 address as its IPv4 address), or None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # the same host: ::ffff:127.0.0.1 is 127.0.0.1
    return ip


def _is_host(host: str) -> bool:
    if host.startswith("["):
        return _bracketed_ip(host) is not None
    return _ip(host) is not None or _HOSTNAME_RE.fullmatch(host) is not None


def _bracketed_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of ``[IPv6]`` (an IPv4-mapped one as its IPv4 address); None when the brackets
    hold no IPv6 address (``[127.0.0.1]``)."""
    try:
        ipaddress.IPv6Address(host[1:-1])
    except ValueError:
        return None
    return _ip(host)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (IPv6 with or without brackets, IPv4-mapped
    IPv6 unwrapped first): the one loopback rule for endpoints, listen addresses and the embedded
    server."""
    if host.lower() == "localhost":
        return True
    ip = _bracketed_ip(host) if host.startswith("[") else _ip(host)
    return ip is not None and ip.is_loopback


def _is_unspecified(host: str) -> bool:
    ip = _ip(host)
    return ip is not None and ip.is_unspecified
