"""The webhook SSRF guard, called directly and never connecting: IPv6 forms that stand for an internal
IPv4 address are internal, site-local and local-use NAT64 addresses too; the same forms of public
addresses stay public. And an endpoint no HTTP client can use, stored before registration refused it,
is dropped at notification without a traceback."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.memory import MemoryInboxStore, MemoryNoticeStore, MemoryRegistry, MemoryState
from adapters.memory.webhooks import MemoryWebhooks
from adapters.webhooks.dispatcher import WebhookDispatcher
from adapters.webhooks.transport import (
    BlockedAddress,
    GuardedBackend,
    embedded_ipv4,
    is_public,
    webhook_client,
)
from broker.addresses import ClaudeCodeAddress, RemoteAddress
from broker.agent_message import AgentMessageContract
from broker.errors import InvalidAddress
from broker.relay import Relay
from broker.testing.polling import eventually
from broker.webhooks import new_secret
from tests.fuzz_support import ErrorLog, error_log

__all__ = ["error_log"]

INTERNAL = [
    ("2002:7f00:1::1", "6to4 of 127.0.0.1"),
    ("2002:a9fe:a9fe::1", "6to4 of 169.254.169.254"),
    ("2002:a00:1::", "6to4 of 10.0.0.1"),
    ("64:ff9b::a9fe:a9fe", "NAT64 of 169.254.169.254"),
    ("64:ff9b::7f00:1", "NAT64 of 127.0.0.1"),
    ("64:ff9b:1::a00:1", "local-use NAT64"),
    ("64:ff9b:1::808:808", "local-use NAT64, whatever it embeds"),
    ("::7f00:1", "IPv4-compatible 127.0.0.1"),
    ("::a9fe:a9fe", "IPv4-compatible 169.254.169.254"),
    ("::ffff:0:a9fe:a9fe", "SIIT of 169.254.169.254"),
    ("::ffff:0:7f00:1", "SIIT of 127.0.0.1"),
    ("::ffff:127.0.0.1", "mapped 127.0.0.1"),
    ("::ffff:10.0.0.1", "mapped 10.0.0.1"),
    ("fec0::1", "site-local"),
    ("fef0::1", "site-local"),
    ("::1", "loopback"),
    ("fd00::1", "unique local"),
    ("fe80::1", "link-local"),
    ("169.254.169.254", "link-local IPv4"),
]
PUBLIC = ["8.8.8.8", "2606:4700::1111", "2002:808:808::1", "64:ff9b::808:808", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "what"), INTERNAL)
async def test_internal_addresses_in_every_form_are_refused(address: str, what: str) -> None:
    assert not is_public(ipaddress.ip_address(address)), what
    with pytest.raises(BlockedAddress, match="not a public address"):  # before any connection
        await GuardedBackend(allow_private=False).connect_tcp(address, 443)


@pytest.mark.parametrize("address", PUBLIC)
def test_the_same_forms_of_public_addresses_stay_public(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def test_the_embedded_address_is_read_from_each_form() -> None:
    expected = ipaddress.IPv4Address("169.254.169.254")
    for form in (
        "2002:a9fe:a9fe::1",
        "64:ff9b::a9fe:a9fe",
        "::a9fe:a9fe",
        "::ffff:0:a9fe:a9fe",
        "::ffff:a9fe:a9fe",
    ):
        assert embedded_ipv4(ipaddress.IPv6Address(form)) == expected, form
    assert embedded_ipv4(ipaddress.IPv6Address("2606:4700::1111")) is None


@contextlib.asynccontextmanager
async def dispatching() -> AsyncIterator[
    tuple[Relay[object], MemoryWebhooks, WebhookDispatcher, CollectorRegistry]
]:
    state = MemoryState()
    notices = MemoryNoticeStore(state)
    metrics = CollectorRegistry()
    async with Relay(
        AgentMessageContract(), MemoryInboxStore(state), MemoryRegistry(state), notices=notices
    ) as relay:
        webhooks = MemoryWebhooks(state)
        dispatcher = WebhookDispatcher(webhooks, notices, webhooks, webhook_client(), metrics, retry_for=1.0)
        try:
            yield relay, webhooks, dispatcher, metrics
        finally:
            await dispatcher.close()


@pytest.mark.parametrize(
    "endpoint", ["https://0177.0.0.1:8443/", "https://127.000.000.001:8443/", "https://[::1]]/"]
)
async def test_an_endpoint_stored_before_registration_refused_it_is_dropped_quietly(
    error_log: ErrorLog, endpoint: str
) -> None:
    async with dispatching() as (relay, webhooks, dispatcher, metrics):
        await relay.register("sender", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s1")
        with pytest.raises(Exception, match="endpoint"):
            RemoteAddress.parse(endpoint)  # refused today; written as an older relay stored it
        await relay.register("far", RemoteAddress(endpoint), "s1")
        assert await webhooks.set_secret("far", "s1", endpoint, new_secret())
        body = relay.contract.from_json({"kind": 1, "text": "hello"})
        await relay.send("sender", "far", body, session="s1")
        dispatcher.notify("far")
        refused = {"outcome": "refused"}
        await eventually(
            lambda: (metrics.get_sample_value("csf_relay_webhooks_total", refused) or 0) == 1, 10, "refused"
        )
        await eventually(lambda: dispatcher.in_flight() == 0, 10, "the notification done")
    assert error_log.problems() == []


HOSTS = st.one_of(
    st.from_regex(r"[a-z0-9.\-\[\]:%_]{1,24}", fullmatch=True),
    st.ip_addresses().map(lambda ip: f"[{ip}]" if ip.version == 6 else str(ip)),
    st.sampled_from(
        ["0177.0.0.1", "127.000.000.001", "0x7f.1", "[::1]]", "[::1", "a..b", "xn--a", "[fe80::1%eth0]"]
    ),
)
PORTS = st.one_of(
    st.just(""), st.integers(-1, 70000).map(lambda n: f":{n}"), st.sampled_from([":", ":00080", ":1:2"])
)
PATHS = st.one_of(st.just(""), st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(HOSTS, PORTS, PATHS)
def test_every_https_endpoint_registration_accepts_is_a_url_the_client_takes(
    host: str, port: str, path: str
) -> None:
    endpoint = f"https://{host}{port}/{path}"
    try:
        RemoteAddress.parse(endpoint)
    except InvalidAddress:
        return
    httpx2.URL(endpoint)  # raises InvalidURL for a URL no notification could be posted to
