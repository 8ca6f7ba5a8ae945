"""The network listener of a real ``relay serve``: the official MCP client over HTTPS (``trustme``
certificates), tokens bound to their listener, remote-only registration, network-tier counting,
webhooks verified with ``standardwebhooks``, plain HTTP and mutual TLS."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.front.key_file import load_key_file
from broker.front.tokens import NETWORK_AUDIENCE, agent_headers, generate_key
from broker.testing.polling import eventually
from tests.front_support import data, free_port, key_file
from tests.processes import MCP_HEADERS, REGISTER, ServeProcess, call_tool, run_relay, sample, tool_call_body
from tests.tls_support import Certificates, certificates, receiver


class Listener:
    def __init__(self, process: ServeProcess, port: int, key: Path, certs: Certificates) -> None:
        self.process, self.port, self.key, self.certs = process, port, key, certs

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mcp/agent"

    def headers(self, agent: str, *, network: bool = True) -> dict[str, str]:
        audience = NETWORK_AUDIENCE if network else None
        return agent_headers(load_key_file(self.key), agent, "s1", 3600, audience=audience)

    def http(self, agent: str | None = None, *, network: bool = True, **kwargs: Any) -> httpx2.AsyncClient:
        headers = self.headers(agent, network=network) if agent else {}
        verify = kwargs.pop("verify", self.certs.client_context())
        return httpx2.AsyncClient(headers=headers, verify=verify, timeout=30, **kwargs)

    @contextlib.asynccontextmanager
    async def mcp(self, agent: str) -> AsyncIterator[Client]:
        async with (
            self.http(agent) as http,
            Client(streamable_http_client(self.url, http_client=http)) as client,
        ):
            yield client


def network_args(redis_url: str, key: Path, certs: Certificates, port: int, *extra: str) -> list[str]:
    return [
        "--redis-url", redis_url, "--agent-mcp-key-file", str(key),
        "--network-host", "127.0.0.1", "--network-port", str(port),
        "--tls-cert", str(certs.cert_file), "--tls-key", str(certs.key_file),
        "--webhook-allow-private", "--webhook-ca-file", str(certs.ca_file), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def listener(
    redis_url: str, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Listener]:
    tmp = tmp_path_factory.mktemp("network")
    key, port = key_file(tmp), free_port()
    process = ServeProcess(network_args(redis_url, key, certs, port), tmp / "serve.log").start()
    try:
        yield Listener(process, port, key, certs)
    finally:
        process.stop()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def test_remote_agents_use_the_mcp_tools_over_https_and_get_signed_webhooks(
    listener: Listener, certs: Certificates
) -> None:
    far, near = unique("far"), unique("near")
    before = listener.process.metrics()
    async with receiver(certs) as hook, listener.mcp(far) as client:
        assert {t.name for t in (await client.list_tools()).tools} >= {"RegisterAgentAddress"}
        reg = data(
            await client.call_tool("RegisterAgentAddress", {"provider": "remote", "endpoint": hook.url})
        )
        assert reg["tier"] == "network"
        secret = reg["webhook_secret"]
        assert secret.startswith("whsec_")
        again = data(
            await client.call_tool("RegisterAgentAddress", {"provider": "remote", "endpoint": hook.url})
        )
        assert again["webhook_secret"] != secret  # new on each registration
        secret = again["webhook_secret"]

        async with listener.http() as loopback:
            host = listener.process.url
            near_headers = listener.headers(near, network=False)
            assert not (await call_tool(loopback, host, near_headers, "RegisterAgentAddress", REGISTER)).get(
                "isError"
            )
            sent = await call_tool(
                loopback,
                host,
                near_headers,
                "SendAgentMessage",
                {"to": far, "message": {"kind": 1, "text": "hi"}},
            )
            assert sent["structuredContent"]["tier"] == "network"

        await eventually(lambda: len(hook.for_agent(far)) == 1, 15, "the webhook")
        note = hook.for_agent(far)[0].verified(secret)["data"]
        assert note["pending"] == 1 and note["envelopes"][0]["from"] == near

        inbox = data(await client.call_tool("FetchAgentInbox", {}))["envelopes"]
        assert [e["id"] for e in inbox] == [sent["structuredContent"]["id"]] and inbox[0]["tier"] == "network"
        data(await client.call_tool("AcknowledgeAgentInbox", {"ids": [inbox[0]["id"]]}))

    after = listener.process.metrics()
    for name in ("csf_relay_envelopes_sent_total", "csf_relay_envelopes_delivered_total"):
        assert sample(after, name, tier="network") == sample(before, name, tier="network") + 1
    assert sample(after, "csf_relay_webhooks_total", outcome="delivered") >= 1
    shown = json.loads(run_relay("inspect", far, "--redis-url", _redis_of(listener), "--json").stdout)
    assert json.dumps(shown).count('"tier": "network"') >= 1


def _redis_of(listener: Listener) -> str:
    args = listener.process.args
    return args[args.index("--redis-url") + 1]


async def test_tokens_are_bound_to_their_listener(listener: Listener) -> None:
    agent = unique("crossed")
    body = json.dumps(tool_call_body("FetchAgentInbox", {}))
    async with listener.http() as http:
        host_on_network = await http.post(
            listener.url, content=body, headers={**MCP_HEADERS, **listener.headers(agent, network=False)}
        )
        network_on_host = await http.post(
            listener.process.url, content=body, headers={**MCP_HEADERS, **listener.headers(agent)}
        )
    for refused in (host_on_network, network_on_host):
        assert refused.status_code == 401
        assert refused.json()["error"]["data"]["cause"] == "wrong_audience"


async def test_each_listener_takes_only_its_own_addresses(listener: Listener) -> None:
    agent = unique("addr")
    async with listener.mcp(agent) as client:
        refused = await client.call_tool("RegisterAgentAddress", REGISTER)
        assert refused.is_error and "provider.known" in json.dumps(refused.model_dump(mode="json"))
        reg = data(
            await client.call_tool(
                "RegisterAgentAddress", {"provider": "remote", "endpoint": "agents.example.net:443"}
            )
        )
        assert "webhook_secret" not in reg  # not an https endpoint: nothing to sign for
    async with listener.http() as http:
        remote = {"provider": "remote", "endpoint": "https://agents.example.net/hook"}
        result = await call_tool(
            http, listener.process.url, listener.headers(agent, network=False), "RegisterAgentAddress", remote
        )
        assert result["isError"]


async def test_plain_http_to_the_network_port_gets_no_mcp_answer(listener: Listener) -> None:
    body = json.dumps(tool_call_body("FetchAgentInbox", {}))
    async with httpx2.AsyncClient(timeout=10) as http:
        try:
            response = await http.post(
                f"http://127.0.0.1:{listener.port}/mcp/agent",
                content=body,
                headers={**MCP_HEADERS, **listener.headers("plain")},
            )
        except httpx2.TransportError:
            return
    assert response.status_code >= 400 and "jsonrpc" not in response.text


async def test_the_metrics_stay_on_the_loopback_listener(listener: Listener) -> None:
    async with listener.http() as http:
        assert (await http.get(f"https://127.0.0.1:{listener.port}/metrics")).status_code == 404
        assert (await http.get(f"https://127.0.0.1:{listener.port}/readyz")).status_code == 200


def test_serve_refuses_a_network_listener_without_certificate_and_key(redis_url: str, tmp_path: Path) -> None:
    key = key_file(tmp_path)
    done = run_relay(
        "serve", "--redis-url", redis_url, "--agent-mcp-key-file", key, "--port", str(free_port()),
        "--network-port", str(free_port()),
    )  # fmt: skip
    assert done.returncode != 0
    assert "--tls-cert" in done.stderr and "Traceback" not in done.stderr
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    base = ["serve", "--redis-url", redis_url, "--agent-mcp-key-file", str(key), "--port", str(free_port())]
    bad = run_relay(*base, "--network-port", str(free_port()), "--tls-cert", garbage, "--tls-key", garbage)
    assert bad.returncode != 0 and "TLS files do not load" in bad.stderr and "Traceback" not in bad.stderr
    stray = run_relay(*base, "--tls-cert", garbage)
    assert stray.returncode != 0 and "--network-port" in stray.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ["--network-host", "127.0.0.1", "--network-port", str(taken.getsockname()[1])]
        certs = certificates(tmp_path)
        tls = ["--tls-cert", certs.cert_file, "--tls-key", certs.key_file]
        done = run_relay(*base, *busy, *tls)
    assert done.returncode != 0 and "cannot listen on" in done.stderr and "Traceback" not in done.stderr


async def test_mutual_tls_requires_a_client_certificate(
    redis_url: str, certs: Certificates, tmp_path: Path
) -> None:
    key, port = key_file(tmp_path), free_port()
    args = network_args(redis_url, key, certs, port, "--tls-client-ca", str(certs.ca_file))
    process = ServeProcess(args, tmp_path / "serve.log").start()
    try:
        listener = Listener(process, port, key, certs)
        agent = unique("mtls")
        async with listener.http(agent) as anonymous:
            with pytest.raises(httpx2.TransportError):
                await anonymous.post(listener.url, content=b"{}", headers=MCP_HEADERS)
        context = certs.client_context()
        context.load_cert_chain(str(certs.client_identity(tmp_path)))
        async with listener.http(agent, verify=context) as http:
            result = await call_tool(http, listener.url, {}, "FetchAgentInbox", {})
            assert result["isError"]  # through TLS and auth; refused only as unregistered
            assert "unregistered" in json.dumps(result)
    finally:
        process.stop()


def test_agent_headers_network_mints_a_network_token(tmp_path: Path) -> None:
    key = key_file(tmp_path)
    done = run_relay("agent-headers", "--key-file", key, "--agent", "a", "--session", "s", "--network")
    token = json.loads(done.stdout)["Authorization"].removeprefix("Bearer ")
    load_key_file(key).verify(token, "a", "s", audience=NETWORK_AUDIENCE)
    config = run_relay(
        "mcp-config", "--key-file", key, "--agent", "a", "--session", "s", "--network",
        "--url", "http://127.0.0.1:9/mcp/agent",
    )  # fmt: skip
    assert config.returncode != 0 and "https" in config.stderr


async def test_sighup_rotates_the_key_on_the_network_listener_and_sigterm_stops_both(
    redis_url: str, certs: Certificates, tmp_path: Path
) -> None:
    key, port = key_file(tmp_path), free_port()
    process = ServeProcess(network_args(redis_url, key, certs, port), tmp_path / "serve.log").start()
    listener = Listener(process, port, key, certs)
    agent = unique("rotated")
    old = listener.headers(agent)
    key.write_text(generate_key() + "\n")  # the old key is gone from the file
    key.chmod(0o600)
    new = listener.headers(agent)
    body = json.dumps(tool_call_body("FetchAgentInbox", {}))

    async def statuses() -> tuple[int, ...]:
        async with listener.http() as http:
            found = [
                await http.post(listener.url, content=body, headers={**MCP_HEADERS, **h}) for h in (old, new)
            ]
        return tuple(r.status_code for r in found)

    try:
        assert await statuses() == (200, 401)
        assert process.proc is not None
        process.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "key file reloaded" in process.log.read_text(), 10, "reloaded")
        assert await statuses() == (401, 200)
    finally:
        assert process.stop() == 0
    assert "Traceback" not in process.log.read_text()


@pytest.mark.parametrize(
    ("endpoint", "rule"),
    [
        ("http://agents.example.net/hook", "remote.network"),
        ("https://user:pw@agents.example.net/hook", "remote.network"),
        ("127.0.0.1:9000", "remote.network"),
        # loopback in IPv4-mapped IPv6 is loopback: the tier rule sees through it
        ("[::ffff:127.0.0.1]:80", "remote.network"),
        ("[::ffff:7f00:1]:80", "remote.network"),
        ("[::ffff:0.0.0.0]:80", "remote.network"),
        # what URL parsers and resolvers read as 127.0.0.1 is written as 127.0.0.1, or refused
        ("https://0177.0.0.1:8443/", "endpoint.ipv4_form"),
        ("https://127.000.000.001:8443/", "endpoint.ipv4_form"),
        ("https://0x7f.1/", "endpoint.ipv4_form"),
        ("https://2130706433/", "endpoint.ipv4_form"),
        ("0177.0.0.1:80", "endpoint.ipv4_form"),
        ("127.1:80", "endpoint.ipv4_form"),
        ("https://[::1]]/hook", "remote.network"),
        ("https://agents.example.net:0/hook", "remote.network"),
        ("https://", "remote.network"),
        ("https://" + "a" * 2100, "endpoint.max_len"),
        ("", "endpoint.required"),
    ],
)
async def test_hostile_remote_endpoints_are_refused_precisely(
    listener: Listener, endpoint: str, rule: str
) -> None:
    agent = unique("hostile")
    async with listener.http() as http:
        result = await call_tool(
            http,
            listener.url,
            listener.headers(agent),
            "RegisterAgentAddress",
            {"provider": "remote", "endpoint": endpoint},
        )
    assert result["isError"]
    error = json.loads(result["content"][0]["text"])["error"]
    assert error["code"] == "invalid_address", error
    [violation] = error["violations"]
    assert (violation["field"], violation["rule"]) == ("endpoint", rule)
    assert "webhook_secret" not in json.dumps(result)
    inspected = run_relay("inspect", agent, "--redis-url", _redis_of(listener), "--json")
    assert '"registered": true' not in inspected.stdout  # nothing was stored
