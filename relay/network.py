"""The network listener of ``relay serve`` and the webhook dispatcher behind it.

With ``--network-port`` a second uvicorn server runs in the same process and event loop, serving the
agent MCP tools at ``/mcp/agent`` over HTTPS only (``--tls-cert`` / ``--tls-key``; ``--tls-client-ca``
adds mutual TLS) for network tokens and ``remote`` addresses. The webhook dispatcher runs with it: it
follows every wake-up and notifies the remote agents registered with an ``https://`` endpoint.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from adapters.redis import RedisConnection
from adapters.redis.operator_view import RedisOperatorView
from adapters.redis.webhooks import RedisWebhooks
from adapters.webhooks.dispatcher import WebhookDispatcher
from adapters.webhooks.transport import webhook_client
from broker.agent_message import AgentMessage
from broker.front.app import NetworkListener, create_app
from broker.front.tokens import KeyRing
from broker.front.tools import ToolOptions
from broker.ports import ICredentials, INoticeStore
from broker.relay import Relay
from relay.settings import ServeSettings, SettingsError, check_bind

log = logging.getLogger("relay.serve")


def check_network(settings: ServeSettings) -> None:
    """Refuse a network listener without a usable certificate and key, before anything starts."""
    if settings.network_port is None:
        stray = [n for n in ("tls_cert", "tls_key", "tls_client_ca") if getattr(settings, n) is not None]
        if stray:
            raise SettingsError(
                f"--{stray[0].replace('_', '-')} is for the network listener: add --network-port PORT"
            )
        return
    if settings.tls_cert is None or settings.tls_key is None:
        raise SettingsError(
            "--network-port needs --tls-cert FILE and --tls-key FILE: the network listener is served "
            "over HTTPS only"
        )
    if settings.uds is None and settings.network_port == settings.port:
        raise SettingsError(f"--network-port {settings.network_port} is also --port; pick another")
    try:
        server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"the network listener's TLS files do not load: {exc}") from exc
    check_bind(
        settings.network_host,
        settings.network_port,
        host_option="--network-host",
        port_option="--network-port",
    )


def server_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """What uvicorn will build from the same files, built once up front to report bad files clearly."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        context.load_verify_locations(cafile=str(client_ca))
    return context


def network_server(
    settings: ServeSettings,
    relay: Relay[AgentMessage],
    keyring: KeyRing,
    webhooks: RedisWebhooks,
    loopback: uvicorn.Config,
    credentials: ICredentials | None = None,
) -> uvicorn.Server:
    """The network listener's server (see the module docstring), with the HTTP protocol, limits and
    shutdown timing of the ``loopback`` listener's configuration."""
    assert settings.network_port is not None and settings.tls_cert and settings.tls_key
    app = create_app(
        relay,
        keyring=keyring,
        max_body_bytes=settings.max_body_bytes,
        allowed_hosts=[],  # any Host name: the listener is reached by whatever name the network uses
        network=NetworkListener(webhooks=webhooks),
        tool_options=ToolOptions(
            directory=settings.directory == "on", mail=RedisOperatorView(webhooks.connection)
        ),
        credentials=credentials,
    )
    config = uvicorn.Config(
        app,
        host=settings.network_host,
        port=settings.network_port,
        ssl_certfile=str(settings.tls_cert),
        ssl_keyfile=str(settings.tls_key),
        ssl_ca_certs=str(settings.tls_client_ca) if settings.tls_client_ca else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if settings.tls_client_ca else ssl.CERT_NONE,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=loopback.timeout_graceful_shutdown,
        server_header=False,
        http=loopback.http,
        timeout_keep_alive=loopback.timeout_keep_alive,
    )
    mtls = " (client certificates required)" if settings.tls_client_ca else ""
    log.info(
        "network listener on https://%s:%d/mcp/agent%s",
        settings.network_host,
        settings.network_port,
        mtls,
    )
    return uvicorn.Server(config)


def start_webhooks(
    settings: ServeSettings, connection: RedisConnection, notices: INoticeStore, metrics: CollectorRegistry
) -> tuple[RedisWebhooks, WebhookDispatcher]:
    """The webhook state and a dispatcher following every wake-up of this worker; it announces
    through ``notices``, the store behind ``POST /agent/wait`` (one cursor per agent for both)."""
    webhooks = RedisWebhooks(connection)
    client = webhook_client(allow_private=settings.webhook_allow_private, ca_file=settings.webhook_ca_file)
    dispatcher = WebhookDispatcher(webhooks, notices, webhooks, client, metrics)
    connection.wakeups.watch(dispatcher.notify, dispatcher.look_at_all)
    if settings.webhook_allow_private:
        log.warning("--webhook-allow-private: webhooks may go to loopback and private addresses")
    return webhooks, dispatcher
