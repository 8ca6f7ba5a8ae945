"""The HTTP client that delivers webhooks, with the SSRF guard in its connection layer.

Every connection resolves the endpoint's host itself, refuses it unless every address it resolves to is
public (no loopback, private, link-local, shared, multicast, reserved or unspecified address, nor an
IPv6 form that stands for such an IPv4 address: mapped, translated, compatible, NAT64, 6to4; no
site-local or local-use NAT64 address) and then connects to the address it checked: a name that resolves to a
public address when checked and to an internal one when connecting (DNS rebinding) has no second
resolution to slip into. TLS still verifies the certificate against the host name (the system store,
or a given CA bundle). Redirects are never followed, proxies from the environment never used.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import httpcore2
import httpx2

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
CONNECT_TIMEOUT: Final = 5.0
ATTEMPT_TIMEOUT: Final = 10.0
"""Seconds one delivery attempt may take, each of connect, write and read."""


class BlockedAddress(Exception):
    """The endpoint's host is, or resolves to, an address webhooks are not delivered to."""


_EMBEDDING_V4: Final = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT)
        "::/96",  # IPv4-compatible (deprecated; :: and ::1 are in it too)
        "64:ff9b::/96",  # NAT64, the well-known prefix
    )
)
_INTERNAL_V6: Final = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # NAT64 for local use: it reaches local IPv4 networks
    ipaddress.IPv6Network("fec0::/10"),  # site-local (deprecated, still routed inside sites)
)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, when it is one of the forms that reach it: mapped,
    translated (SIIT), compatible, NAT64 (the last 32 bits) or 6to4 (the 32 bits after ``2002:``)."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _EMBEDDING_V4):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    """True for addresses on the public internet; ``is_global`` leaves out private, loopback,
    link-local, shared (100.64/10), reserved and documentation ranges. An IPv6 address that stands for
    an IPv4 one (``embedded_ipv4``) is public only when both are; local-use NAT64 and site-local
    addresses never are."""
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in net for net in _INTERNAL_V6):
            return False
        inner = embedded_ipv4(ip)
        if inner is not None and not is_public(inner):
            return False
        if ip.ipv4_mapped is not None:  # Python's is_global reads a mapped address as IPv6 space
            return True
    return ip.is_global and not ip.is_multicast


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (an IP literal resolves to itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpcore2.ConnectError(f"{host} does not resolve ({exc})") from exc
    found: list[IPAddress] = []
    for *_, address in infos:
        ip = ipaddress.ip_address(str(address[0]).partition("%")[0])
        if ip not in found:
            found.append(ip)
    return found


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Resolves, checks and connects to the checked address (see the module docstring)."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await resolve(host, port)
        if not addresses:
            raise httpcore2.ConnectError(f"{host} resolves to no address")
        if not self.allow_private:
            blocked = [ip for ip in addresses if not is_public(ip)]
            if blocked:
                raise BlockedAddress(
                    f"{host} resolves to {blocked[0]}, not a public address; webhooks go to public "
                    "addresses only (relay serve --webhook-allow-private lifts this for local testing)"
                )
        return await self._inner.connect_tcp(
            str(addresses[0]),
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's backend interface
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise BlockedAddress("webhooks are not delivered to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, context: ssl.SSLContext, backend: GuardedBackend) -> None:
        super().__init__(verify=context, trust_env=False)
        # httpx builds its connection pool without a way to pass a network backend: the pool is
        # replaced by an equal one that connects through the guard.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=context, max_connections=256, keepalive_expiry=30.0, network_backend=backend
        )


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Certificates verified against ``ca_file`` or, without one, the system store."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def webhook_client(*, allow_private: bool = False, ca_file: Path | None = None) -> httpx2.AsyncClient:
    """The client webhooks are POSTed with."""
    transport = _GuardedTransport(tls_context(ca_file), GuardedBackend(allow_private=allow_private))
    return httpx2.AsyncClient(
        transport=transport,
        follow_redirects=False,
        trust_env=False,
        timeout=httpx2.Timeout(ATTEMPT_TIMEOUT, connect=CONNECT_TIMEOUT),
    )
