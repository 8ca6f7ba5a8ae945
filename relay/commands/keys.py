"""``relay keygen``, ``relay agent-headers`` and ``relay mcp-config``: signing keys and the headers an
agent sends on every ``/mcp/agent`` request."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from broker.front.key_file import load_key_file, write_key_file
from broker.front.paths import MCP_PATH
from broker.front.tokens import DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, agent_headers
from broker.ids import check_agent_id, check_session_id
from relay.commands import UsageError, bounded_int

if TYPE_CHECKING:
    from relay.commands import Subparsers


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
        required=True,
        help=f"relay endpoint, e.g. http://127.0.0.1:8080{MCP_PATH} ({MCP_PATH} is appended to a bare host)",
    )
    config.add_argument("--name", default="relay", help="server name in the configuration (default relay)")
    config.set_defaults(handler=_mcp_config)


def _add_token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file",
        type=Path,
        required=True,
        metavar="PATH",
        help="signing key file (mode 0600, from `relay keygen`)",
    )
    parser.add_argument("--agent", required=True, help="agent id the token is for, e.g. reviewer")
    parser.add_argument("--session", required=True, help="session id of that agent's conversation")
    parser.add_argument(
        "--ttl",
        type=bounded_int(1, MAX_TTL_SECONDS, "seconds"),
        default=DEFAULT_TTL_SECONDS,
        metavar="SECONDS",
        help=f"token lifetime, 1..{MAX_TTL_SECONDS} (default {DEFAULT_TTL_SECONDS})",
    )


def _keygen(args: argparse.Namespace) -> int:
    kid = write_key_file(args.path, force=args.force)
    print(f"wrote signing key {kid} to {args.path}; next: relay serve --agent-mcp-key-file {args.path}")
    return 0


def _minted_headers(args: argparse.Namespace) -> dict[str, str]:
    check_agent_id(args.agent, "--agent")
    check_session_id(args.session, "--session")
    return agent_headers(load_key_file(args.key_file), args.agent, args.session, args.ttl)


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
    url = endpoint_url(args.url)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", args.name):
        raise UsageError(f"--name {args.name!r}: use 1-64 letters, digits, '_' or '-'")
    entry = {"type": "http", "url": url, "headers": _minted_headers(args)}
    print(json.dumps({"mcpServers": {args.name: entry}}, indent=2))
    return 0
