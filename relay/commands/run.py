"""``relay run CLI [ARGS...]``: start a coding-agent CLI with relay's agent headers in its environment
(``relay.launch``), for CLIs that read MCP headers from ``${VAR}`` and run no headers helper."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from relay.commands import UsageError
from relay.launch import LAUNCHABLE, LaunchError, run

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="start a coding-agent CLI (gemini) with fresh relay headers in its environment",
        description="Exchange the folder's credential (DIR/.relay/credential, written by `relay setup "
        "CLI`) for a new session's agent headers, register the session, and run CLI with ARGS and the "
        "headers in its environment (the ${RELAY_...} variables its settings name). relay's own options come "
        "before CLI; everything after it goes to the CLI.",
    )
    parser.add_argument("cli", choices=sorted(LAUNCHABLE), metavar="CLI", help=", ".join(sorted(LAUNCHABLE)))
    parser.add_argument(
        "--dir", type=Path, metavar="DIR", help="the set-up folder (default: the current one)"
    )
    parser.add_argument("--command", metavar="PATH", help="the CLI's executable (default: found on PATH)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the CLI")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    folder = Path(os.path.abspath(args.dir or Path.cwd()))
    rest = list(args.args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    try:
        return run(args.cli, rest, folder, args.command)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
