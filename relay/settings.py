"""Settings of the ``relay`` commands, each declared once.

A setting is a field of a pydantic-settings model: its type, bounds, default and one-line help live on
the field, and everything else is derived from it: the command-line option (``--inbox-cap`` for
``inbox_cap``), the environment variable (``RELAY_INBOX_CAP``) and the help text. Values are read once
per command, command line over environment over default, checked by pydantic, and passed down; nothing
else reads the environment.
"""

from __future__ import annotations

import argparse
import socket
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from adapters.redis.embedded_state import running_server_url
from broker.front import http_limits as front_limits
from broker.limits import (
    DEFAULT_HISTORY_RETENTION_MS,
    DEFAULT_IDEMPOTENCY_WINDOW_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_REMIND_AFTER_SECONDS,
    DEFAULT_STATUS_RETENTION_MS,
    MAX_HISTORY_RETENTION_MS,
    MAX_TTL_MS,
    MIN_TTL_MS,
)

ENV_PREFIX = "RELAY_"
DEFAULT_DATA_DIR = Path(".relay")
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")

_S = TypeVar("_S", bound=BaseSettings)


class SettingsError(ValueError):
    """A setting with a bad value; the message names the option, the variable and what to do."""


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="forbid"
    )


class DataDirSettings(_Settings):
    """The data dir: the embedded server's data, and the signing key ``relay serve`` creates there."""

    data_dir: Path = Field(
        DEFAULT_DATA_DIR, description="where the embedded server keeps its data and relay its signing key"
    )


class StoreSettings(DataDirSettings):
    """Where relay's data lives: every command that reads or writes the store takes these."""

    redis_url: str | None = Field(
        None,
        description="Redis URL, e.g. redis://127.0.0.1:6379/0; without it `relay serve` starts an embedded "
        "server under the data dir",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(REDIS_URL_SCHEMES):
            raise ValueError("not a Redis URL; use redis://HOST:PORT/DB, rediss://... or unix:///path")
        return value


class KeyFileSettings(DataDirSettings):
    """Where the commands minting with relay's signing key find it
    (``relay.commands.signing.signing_keys``)."""

    key_file: Path | None = Field(
        None, description="relay's signing key file; default: relay.key in the data dir"
    )


class ShellSettings(StoreSettings, KeyFileSettings):
    """The shell commands (``relay agents``, ``send``, ``read``, ``tail``, ``thread``)."""

    url: str | None = Field(
        None,
        description="the running relay's base URL; default: where relay serve listens (same environment)",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("not an http(s) URL; use e.g. http://127.0.0.1:8080")
        return None if value is None else value.rstrip("/")


class ServeSettings(StoreSettings):
    """``relay serve``."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on")
    uds: Path | None = Field(None, description="listen on this unix socket instead of TCP")
    agent_mcp_key_file: Path | None = Field(
        None,
        description="signing key for agent tokens (see `relay keygen`), read again on SIGHUP; without it "
        "relay.key in the data dir, created on first start",
    )
    log_format: Literal["text", "json"] = Field("text", description="log lines as text or JSON")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    inbox_cap: int = Field(
        10000, ge=0, le=10_000_000, description="unacknowledged envelopes an inbox may hold; 0 = no cap"
    )
    send_rate: float = Field(
        0.0,
        ge=0,
        le=1_000_000,
        description="sends per second an agent may make, across workers; 0 = no limit",
    )
    send_burst: int = Field(
        0, ge=0, le=1_000_000, description="sends an agent may make at once above its rate; 0 = 2 x rate"
    )
    max_body_bytes: int = Field(
        front_limits.DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        le=64 * 1024 * 1024,
        description="largest /mcp/agent request body",
    )
    idle_timeout: float = Field(
        front_limits.DEFAULT_IDLE_TIMEOUT,
        gt=0,
        le=3600,
        description="seconds a connection may idle between requests",
    )
    header_timeout: float = Field(
        front_limits.DEFAULT_HEADER_TIMEOUT,
        gt=0,
        le=3600,
        description="seconds a request's headers may take to arrive",
    )
    max_header_bytes: int = Field(
        front_limits.DEFAULT_MAX_HEADER_BYTES,
        ge=1024,
        le=16 * 1024 * 1024,
        description="largest request line plus headers",
    )
    body_timeout: float = Field(
        front_limits.DEFAULT_BODY_TIMEOUT,
        gt=0,
        le=3600,
        description="seconds a request body may take to arrive",
    )
    max_connections: int = Field(
        front_limits.DEFAULT_MAX_CONNECTIONS,
        ge=1,
        le=1_000_000,
        description="HTTP connections open at once; a further one is answered 503 and closed",
    )
    directory: Literal["on", "off"] = Field(
        "on", description="serve the ListAgents tool, with which agents find the registered agents"
    )
    wait_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="answer a send, acknowledgement or registration only once this many replicas hold it "
        "(Redis WAIT); 0 = do not wait",
    )
    network_host: str = Field(
        "0.0.0.0", description="address of the network listener (only with --network-port)"
    )
    network_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="open the network listener (/mcp/agent over HTTPS, network tokens and remote addresses "
        "only) on this port; needs --tls-cert and --tls-key",
    )
    tls_cert: Path | None = Field(None, description="PEM certificate (chain) of the network listener")
    tls_key: Path | None = Field(None, description="PEM private key of the network listener")
    tls_client_ca: Path | None = Field(
        None, description="PEM CA bundle: the network listener then requires client certificates it signed"
    )
    webhook_allow_private: bool = Field(
        False,
        description="deliver webhooks to loopback, private and link-local addresses too (local testing only)",
    )
    webhook_ca_file: Path | None = Field(
        None,
        description="PEM CA bundle webhook endpoints' certificates are verified against (default: the "
        "system store)",
    )

    remind_after: float = Field(
        DEFAULT_REMIND_AFTER_SECONDS,
        ge=0,
        le=7 * 24 * 3600,
        description="seconds before POST /agent/wait announces still-unacknowledged mail again; 0 = never",
    )
    max_deliveries: int = Field(
        DEFAULT_MAX_DELIVERIES,
        ge=0,
        le=1_000_000,
        description="hand-outs of an unacknowledged envelope before a fetch moves it to the agent's dead "
        "letters (reason max_deliveries); 0 = no limit",
    )
    max_ttl: int = Field(
        MAX_TTL_MS // 1000,
        ge=MIN_TTL_MS // 1000,
        le=MAX_TTL_MS // 1000,
        description="longest ttl_ms a send may name, in seconds",
    )
    idempotency_window: int = Field(
        DEFAULT_IDEMPOTENCY_WINDOW_MS // 1000,
        ge=1,
        le=MAX_TTL_MS // 1000,
        description="seconds a sender's idempotency key is remembered",
    )
    status_retention: int = Field(
        DEFAULT_STATUS_RETENTION_MS // 1000,
        ge=0,
        le=MAX_TTL_MS // 1000,
        description="seconds a sender can ask GetMessageStatus about an envelope; 0 = keep no status",
    )
    history_retention: int = Field(
        DEFAULT_HISTORY_RETENTION_MS // 1000,
        ge=0,
        le=MAX_HISTORY_RETENTION_MS // 1000,
        description="seconds an acknowledged, dead-lettered or expired envelope stays in its recipient's "
        "history (relay history, threads); 0 = keep no history",
    )
    history_max_bytes: int = Field(
        0,
        ge=0,
        le=1 << 40,
        description="bytes of fields one agent's history keeps at most, its oldest entries going first "
        "(the newest always stays); 0 = no cap",
    )

    @property
    def max_ttl_ms(self) -> int:
        return _ms(self.max_ttl)

    @property
    def idempotency_window_ms(self) -> int:
        return _ms(self.idempotency_window)

    @property
    def status_retention_ms(self) -> int:
        return _ms(self.status_retention)

    @property
    def history_retention_ms(self) -> int:
        return _ms(self.history_retention)

    @property
    def http_limits(self) -> front_limits.HttpLimits:
        """The connection and request limits of the HTTP front."""
        return front_limits.HttpLimits(
            idle_timeout=self.idle_timeout,
            header_timeout=self.header_timeout,
            max_header_bytes=self.max_header_bytes,
            body_timeout=self.body_timeout,
            max_connections=self.max_connections,
        )

    @property
    def burst(self) -> int:
        """The token bucket's size: ``send_burst``, or twice the rate (at least 1) when that is 0."""
        if not self.send_rate:
            return 0
        return self.send_burst or max(1, int(self.send_rate * 2))


def _ms(seconds: int) -> int:
    """A setting declared in seconds (what an operator types), in the milliseconds relay holds every
    time in."""
    return seconds * 1000


def option(name: str) -> str:
    """The command-line option of setting ``name``."""
    return "--" + name.replace("_", "-")


def variable(name: str) -> str:
    """The environment variable of setting ``name``."""
    return ENV_PREFIX + name.upper()


def add_options(parser: argparse.ArgumentParser, model: type[BaseSettings]) -> None:
    """Add an option for every setting of ``model``; its help names the variable and the default."""
    parser.epilog = (
        "Every option can also be set in the environment as the variable in brackets; an option on the "
        "command line wins."
    ) + (f"\n{parser.epilog}" if parser.epilog else "")
    for name, field in model.model_fields.items():
        default = field.get_default()
        shown = "" if default is None else f", default {default}"
        if field.annotation is bool:  # a switch: given means true, absent leaves the environment's
            parser.add_argument(
                option(name),
                dest=name,
                action="store_const",
                const=True,
                default=None,
                help=f"{field.description} [{variable(name)}=true]",
            )
            continue
        choices = _choices(field.annotation)
        parser.add_argument(
            option(name),
            dest=name,
            default=None,
            choices=choices,
            metavar=None if choices else name.upper(),
            help=f"{field.description} [{variable(name)}{shown}]",
        )


def load(model: type[_S], args: argparse.Namespace) -> _S:
    """``model`` from the command line over the environment over the defaults; a bad value raises
    ``SettingsError`` naming the option and the variable."""
    given: dict[str, Any] = {}
    for name in model.model_fields:
        value = getattr(args, name, None)
        if value is not None:
            given[name] = value
    try:
        return model(**given)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, given)) from None


def _describe(exc: ValidationError, given: dict[str, Any]) -> str:
    problems = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else ""
        where = f"{option(name)} / {variable(name)}" if name else "settings"
        source = "" if name in given else " (from the environment)"
        shown = repr(error.get("input"))[:80]
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}{source}: {message} (got {shown})")
    return "; ".join(problems)


def _choices(annotation: object) -> list[str] | None:
    if get_origin(annotation) is Literal:
        return [str(value) for value in get_args(annotation)]
    if get_origin(annotation) in (Union, types.UnionType):
        for member in get_args(annotation):
            found = _choices(member)
            if found is not None:
                return found
    return None


def store_url(settings: StoreSettings, command: str) -> str:
    """The Redis URL a command that reads the store uses: ``--redis-url``, else the embedded server
    running from the data dir; ``SettingsError`` saying what to pass when there is neither."""
    if settings.redis_url is not None:
        return settings.redis_url
    found = running_server_url(settings.data_dir)
    if found is not None:
        return found
    raise SettingsError(
        f"relay is not running here, so `relay {command}` has nothing to read: no relay serve runs from "
        f"the data dir {settings.data_dir.absolute()}. Start it in this folder (`relay serve`), or name "
        f"the store of a relay that runs elsewhere: {option('data_dir')} DIR (its data dir) or --redis-url "
        f"redis://HOST:PORT/DB (or set {variable('redis_url')}) for the Redis it uses"
    )


def store_named(settings: StoreSettings, url: str) -> str:
    """How a command names the store it read, in hints: the (password-free) URL, and the data dir when
    the URL came from it (an empty store there usually means another data dir was meant)."""
    if settings.redis_url is not None:
        return url
    return f"{url} (the embedded server of {settings.data_dir.absolute()})"


def check_bind(host: str, port: int, *, host_option: str, port_option: str) -> None:
    """Fail before anything starts when ``host:port`` cannot be bound, naming the options to change."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise SettingsError(f"{host_option} {host!r} does not resolve ({exc})") from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise SettingsError(
                f"cannot listen on {host}:{port} ({exc.strerror}); pass another {port_option} or stop "
                "what is using it"
            ) from exc
