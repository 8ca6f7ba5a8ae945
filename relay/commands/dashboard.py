"""``relay dashboard-url``: print a one-time login URL for the dashboard at ``/ui``.

The URL carries a dashboard login token signed with (a key derived from) the relay's signing key, so
only someone who can read that key can get in; it works once and for ``--ttl`` seconds. See
docs/dashboard.md.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit, urlunsplit

from broker.addresses import is_loopback_host
from broker.front.paths import MCP_PATH, UI_PATH
from broker.front.ui.access import DEFAULT_LOGIN_TTL, MAX_LOGIN_TTL, OperatorAccess
from relay.commands import UsageError, bounded_int
from relay.commands.signing import default_url, signing_keys
from relay.settings import KeyFileSettings, add_options, load

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard-url",
        help="print a one-time login URL for the dashboard at /ui",
        description="Print a login URL for the relay dashboard (served by `relay serve` at /ui on its "
        "loopback listener). The URL works once, for --ttl seconds; opening it starts a browser session.",
    )
    parser.add_argument(
        "--url",
        help="the relay's base URL, e.g. http://127.0.0.1:8080 (default: where `relay serve` with the same "
        "RELAY_HOST / RELAY_PORT listens)",
    )
    add_options(parser, KeyFileSettings)
    parser.add_argument(
        "--ttl",
        type=bounded_int(1, MAX_LOGIN_TTL, "seconds"),
        default=DEFAULT_LOGIN_TTL,
        metavar="SECONDS",
        help=f"how long the URL stays usable, 1..{MAX_LOGIN_TTL} (default {DEFAULT_LOGIN_TTL})",
    )
    parser.set_defaults(handler=_dashboard_url)


def login_url(base: str, token: str) -> str:
    """The login URL on the relay at ``base`` (``http://HOST:PORT``, loopback only)."""
    parts = urlsplit(base)
    if parts.scheme != "http" or not parts.hostname or not is_loopback_host(parts.hostname):
        raise UsageError(
            f"--url {base!r}: the dashboard is served on the loopback listener only; use "
            "http://127.0.0.1:PORT or http://localhost:PORT"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UsageError(f"--url {base!r}: give the relay's base URL, e.g. http://127.0.0.1:8080")
    return urlunsplit(("http", parts.netloc, f"{UI_PATH}/login", urlencode({"token": token}), ""))


def _dashboard_url(args: argparse.Namespace) -> int:
    base = args.url or default_url().removesuffix(MCP_PATH)
    login_url(base, "")  # a URL the dashboard cannot be reached at is refused before any key is read
    access = OperatorAccess(signing_keys(load(KeyFileSettings, args)))
    print(login_url(base, access.mint_login(args.ttl)))
    return 0
