"""``relay keygen``, ``relay agent-headers`` and ``relay mcp-config``: signing keys and the headers an
agent sends on every ``/mcp/agent`` request.

``relay serve`` without ``--agent-mcp-key-file`` signs with ``relay.key`` in its data dir and creates it
on first start (``ensure_key_file``); the commands here, and ``relay setup claude-code``, use that key
unless given ``--key-file``, so they work against the README's first command as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit, urlunsplit

from broker.front.key_file import load_key_file, write_key_file
from broker.front.paths import MCP_PATH
from broker.front.tokens import (
    DEFAULT_TTL_SECONDS,
    MAX_TTL_SECONDS,
    NETWORK_AUDIENCE,
    KeyRing,
    agent_headers,
)
from broker.ids import check_agent_id, check_session_id
from relay.commands import UsageError, bounded_int
from relay.settings import KeyFileSettings, ServeSettings, add_options, load

if TYPE_CHECKING:
    from relay.commands import Subparsers

KEY_FILE_NAME: Final = "relay.key"
"""The signing key's file name in the data dir."""


def data_key_file(data_dir: Path) -> Path:
    """The signing key ``relay serve`` uses when given no ``--agent-mcp-key-file``."""
    return data_dir / KEY_FILE_NAME


def ensure_key_file(path: Path) -> bool:
    """Create ``path`` (mode 0600, its directory 0700) holding a fresh key unless it exists; True when
    created. The key is written aside and linked into place, so workers starting at once agree on one
    key and none reads a half-written file."""
    if path.exists():
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.new")
    write_key_file(aside, force=True)
    try:
        os.link(aside, path)
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)
    return True


def register(subparsers: Subparsers) -> None:
    keygen = subparsers.add_parser(
        "keygen",
        help="write a new signing key file",
        description="Write a new signing key file (mode 0600) for `relay serve --agent-mcp-key-file`. "
        "To rotate keys, put a new key line first in the existing file and drop the old line once "
        "the tokens it signed have expired.",
    )
    keygen.add_argument("path", type=Path, metavar="PATH", help="where to write the key file")
    keygen.add_argument(
        "--force", action="store_true", help="replace an existing file (tokens signed by it stop verifying)"
    )
    keygen.set_defaults(handler=_keygen)

    headers = subparsers.add_parser(
        "agent-headers",
        help="print the three HTTP headers an agent sends to /mcp/agent",
        description="Mint a token for one agent and session and print the headers (JSON) it sends on "
        "every /mcp/agent request: Authorization, X-CSF-Agent-ID, X-CSF-Session-ID.",
    )
    _add_token_arguments(headers)
    headers.set_defaults(handler=_agent_headers)

    config = subparsers.add_parser(
        "mcp-config",
        help="print an .mcp.json entry for an agent (e.g. a Claude Code session)",
        description='Print an MCP client configuration ({"mcpServers": {NAME: ...}}) for one agent and '
        "session, with freshly minted headers. Merge it into the session's .mcp.json.",
    )
    _add_token_arguments(config)
    config.add_argument(
        "--url",
        help=f"relay endpoint, e.g. http://127.0.0.1:8080{MCP_PATH} ({MCP_PATH} is appended to a bare host; "
        "default: where `relay serve` with the same RELAY_HOST / RELAY_PORT listens)",
    )
    config.add_argument("--name", default="relay", help="server name in the configuration (default relay)")
    config.set_defaults(handler=_mcp_config)


def _add_token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help="agent id the token is for, e.g. reviewer")
    parser.add_argument("--session", required=True, help="session id of that agent's conversation")
    parser.add_argument(
        "--ttl",
        type=bounded_int(1, MAX_TTL_SECONDS, "seconds"),
        default=DEFAULT_TTL_SECONDS,
        metavar="SECONDS",
        help=f"token lifetime, 1..{MAX_TTL_SECONDS} (default {DEFAULT_TTL_SECONDS})",
    )
    add_options(parser, KeyFileSettings)
    parser.add_argument(
        "--network",
        action="store_true",
        help="mint the token for the network listener (relay serve --network-port); only that listener "
        "accepts it, and it accepts no other",
    )


def _keygen(args: argparse.Namespace) -> int:
    kid = write_key_file(args.path, force=args.force)
    print(f"wrote signing key {kid} to {args.path}; next: relay serve --agent-mcp-key-file {args.path}")
    return 0


def _minted_headers(args: argparse.Namespace) -> dict[str, str]:
    check_agent_id(args.agent, "--agent")
    check_session_id(args.session, "--session")
    audience = NETWORK_AUDIENCE if args.network else None
    return agent_headers(
        signing_keys(load(KeyFileSettings, args)), args.agent, args.session, args.ttl, audience=audience
    )


def signing_key_file(settings: KeyFileSettings) -> Path:
    """Where every command finds relay's signing key: ``--key-file`` (``RELAY_KEY_FILE``), else
    ``relay.key`` in the data dir (``--data-dir``, ``RELAY_DATA_DIR``), which ``relay serve`` creates."""
    return settings.key_file if settings.key_file is not None else data_key_file(settings.data_dir)


def signing_keys(settings: KeyFileSettings) -> KeyRing:
    """The keys of ``signing_key_file``; ``UsageError`` with the one advice every command gives when
    there is none (a new key would not help: the running relay verifies with its own)."""
    path = signing_key_file(settings)
    if not path.exists():
        named = "--key-file / RELAY_KEY_FILE" if settings.key_file is not None else "the data dir's key"
        raise UsageError(
            f"no signing key at {path} ({named}): use the key relay serve signs with: run this from the "
            "folder relay serve runs in (it creates .relay/relay.key on first start), or pass --data-dir "
            "(its data dir) or --key-file (its --agent-mcp-key-file)"
        )
    return load_key_file(path)  # a key file that is there but unusable: its own KeyFileError (exit 1)


def default_url() -> str:
    """The /mcp/agent URL of ``relay serve`` started with this environment (RELAY_HOST, RELAY_PORT)."""
    settings = load(ServeSettings, argparse.Namespace())
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}{MCP_PATH}"


def _agent_headers(args: argparse.Namespace) -> int:
    print(json.dumps(_minted_headers(args), indent=2))
    return 0


def endpoint_url(url: str) -> str:
    """``url`` as the /mcp/agent endpoint: http(s) only; a bare host gets the path appended."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8080{MCP_PATH}")
    if parts.query or parts.fragment:
        raise UsageError(f"--url {url!r} has a query or fragment; give just the endpoint")
    if parts.path in ("", "/"):
        return urlunsplit((parts.scheme, parts.netloc, MCP_PATH, "", ""))
    if not parts.path.endswith(MCP_PATH):
        raise UsageError(f"--url {url!r} does not end with {MCP_PATH}; the agent endpoint is served there")
    return url


def _mcp_config(args: argparse.Namespace) -> int:
    url = endpoint_url(args.url) if args.url is not None else default_url()
    if args.network and not url.startswith("https://"):
        raise UsageError(
            f"--url {url!r}: the network listener is served over https only; pass --url https://HOST:PORT"
        )
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", args.name):
        raise UsageError(f"--name {args.name!r}: use 1-64 letters, digits, '_' or '-'")
    entry = {"type": "http", "url": url, "headers": _minted_headers(args)}
    print(json.dumps({"mcpServers": {args.name: entry}}, indent=2))
    return 0
