"""Settings of ``relay serve`` and the Redis-using commands: parsed once (CLI > environment > default)
and passed down; nothing else reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8080
DEFAULT_HOST = "127.0.0.1"
DEFAULT_DATA_DIR = Path(".relay")
MAX_WAIT_SECONDS = 25.0

ENVIRONMENT = {
    "RELAY_HOST": "address to listen on (default 127.0.0.1)",
    "RELAY_PORT": f"TCP port to listen on (default {DEFAULT_PORT})",
    "RELAY_UDS": "unix socket path to listen on instead of TCP",
    "RELAY_REDIS_URL": "Redis to use; without it relay starts an embedded server",
    "RELAY_AGENT_MCP_KEY_FILE": "signing key file; without it /mcp/agent is not served",
    "RELAY_DATA_DIR": f"where the embedded server keeps its data (default {DEFAULT_DATA_DIR})",
    "RELAY_LOG_FORMAT": "text or json (default text)",
    "RELAY_LOG_LEVEL": "debug, info, warning or error (default info)",
    "RELAY_INBOX_CAP": "unacknowledged envelopes an inbox may hold; 0 = no cap (default 10000)",
    "RELAY_SEND_RATE": "sends per second an agent may make, shared by all workers; 0 = no limit (default 0)",
    "RELAY_SEND_BURST": "sends an agent may make at once above its rate (default 2 x rate)",
    "RELAY_MAX_BODY_BYTES": "largest request body /mcp/agent accepts (default 262144)",
    "RELAY_REDIS_SERVER": "path of the redis-server/valkey-server binary for the embedded server",
}


class SettingsError(ValueError):
    """A setting with a bad value; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class ServeSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    uds: Path | None = None
    redis_url: str | None = None
    key_file: Path | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    log_format: str = "text"
    log_level: str = "info"
    inbox_cap: int = 10000
    send_rate: float = 0.0
    send_burst: int = 0
    max_body_bytes: int = 262144
    max_wait: float = MAX_WAIT_SECONDS


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``relay serve``; every default comes from ``serve_settings`` (env, then default)."""
    parser.add_argument("--host", help="address to listen on [RELAY_HOST, default 127.0.0.1]")
    parser.add_argument("--port", type=int, help=f"TCP port [RELAY_PORT, default {DEFAULT_PORT}]")
    parser.add_argument("--uds", type=Path, help="listen on this unix socket instead of TCP [RELAY_UDS]")
    add_redis_argument(parser)
    parser.add_argument(
        "--agent-mcp-key-file",
        type=Path,
        dest="key_file",
        help="signing key for agent tokens (see `relay keygen`), read again on SIGHUP; without it "
        "/mcp/agent is not served [RELAY_AGENT_MCP_KEY_FILE]",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help=f"embedded server data directory [RELAY_DATA_DIR, default {DEFAULT_DATA_DIR}]",
    )
    parser.add_argument("--log-format", choices=["text", "json"], help="[RELAY_LOG_FORMAT, default text]")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="[RELAY_LOG_LEVEL, default info]"
    )
    parser.add_argument(
        "--inbox-cap", type=int, help="max unacknowledged envelopes per inbox, 0 = none [RELAY_INBOX_CAP]"
    )
    parser.add_argument(
        "--send-rate", type=float, help="sends/s per agent across workers, 0 = unlimited [RELAY_SEND_RATE]"
    )
    parser.add_argument("--send-burst", type=int, help="burst above the send rate [RELAY_SEND_BURST]")
    parser.add_argument(
        "--max-body-bytes", type=int, help="largest /mcp/agent request body [RELAY_MAX_BODY_BYTES]"
    )


def bounded_int(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, in ``unit`` (e.g. "seconds") if
    given. A bad value is one usage line that names the range."""
    of_unit = f" of {unit}" if unit else ""
    in_unit = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{of_unit}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}{in_unit}")
        return value

    return parse


def add_redis_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        help="Redis URL, e.g. redis://127.0.0.1:6379/0 [RELAY_REDIS_URL]; serve starts an embedded "
        "server without it",
    )


def redis_url_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    value = getattr(args, "redis_url", None) or env.get("RELAY_REDIS_URL") or None
    if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(
            f"--redis-url {value!r} is not a Redis URL; use redis://HOST:PORT/DB or unix:///path"
        )
    return value


def serve_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeSettings:
    """Merge CLI options over ``RELAY_*`` environment variables over defaults; check every value."""
    env = os.environ if environ is None else environ

    def pick(name: str, key: str) -> str | None:
        value = getattr(args, name, None)
        if value is not None:
            return str(value)
        return env.get(key) or None

    def number(name: str, key: str, default: int, low: int, high: int) -> int:
        raw = pick(name, key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(
                f"{key} / --{name.replace('_', '-')}: {raw!r} is not a whole number"
            ) from None
        if not low <= value <= high:
            raise SettingsError(f"--{name.replace('_', '-')}: {value} is outside {low}..{high}")
        return value

    rate_raw = pick("send_rate", "RELAY_SEND_RATE")
    try:
        send_rate = float(rate_raw) if rate_raw is not None else 0.0
    except ValueError:
        raise SettingsError(f"--send-rate: {rate_raw!r} is not a number") from None
    if not 0 <= send_rate <= 1_000_000:
        raise SettingsError("--send-rate: must be from 0 (unlimited) to 1000000")
    uds = pick("uds", "RELAY_UDS")
    key_file = pick("key_file", "RELAY_AGENT_MCP_KEY_FILE")
    log_format = pick("log_format", "RELAY_LOG_FORMAT") or "text"
    if log_format not in ("text", "json"):
        raise SettingsError(f"RELAY_LOG_FORMAT: {log_format!r} is not text or json")
    log_level = pick("log_level", "RELAY_LOG_LEVEL") or "info"
    if log_level not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"RELAY_LOG_LEVEL: {log_level!r} is not debug, info, warning or error")
    burst = number("send_burst", "RELAY_SEND_BURST", 0, 0, 1_000_000)
    return ServeSettings(
        host=pick("host", "RELAY_HOST") or DEFAULT_HOST,
        port=number("port", "RELAY_PORT", DEFAULT_PORT, 0, 65535),
        uds=Path(uds) if uds else None,
        redis_url=redis_url_from(args, env),
        key_file=Path(key_file) if key_file else None,
        data_dir=Path(pick("data_dir", "RELAY_DATA_DIR") or DEFAULT_DATA_DIR),
        log_format=log_format,
        log_level=log_level,
        inbox_cap=number("inbox_cap", "RELAY_INBOX_CAP", 10000, 0, 10_000_000),
        send_rate=send_rate,
        send_burst=burst if burst else max(1, int(send_rate * 2)) if send_rate else 0,
        max_body_bytes=number("max_body_bytes", "RELAY_MAX_BODY_BYTES", 262144, 1024, 64 * 1024 * 1024),
    )
