"""The ``relay`` command: one parser, each subcommand a module of ``relay.commands``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from broker.errors import InvalidArgument, RelayError
from broker.front.key_file import KeyFileError
from broker.front.tokens import AuthError
from relay.commands import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    Handler,
    Parser,
    UsageError,
    agents,
    credentials,
    dashboard,
    dead_letters,
    history,
    hook,
    inspect,
    lifecycle,
    migrate,
    policy,
    read,
    run,
    send,
    serve,
    setup,
    show,
    signing,
    tail,
    thread,
    workbench,
)
from relay.settings import SettingsError

COMMANDS = (
    serve,
    signing,
    inspect,
    show,
    dead_letters,
    migrate,
    setup,
    run,
    credentials,
    hook,
    agents,
    lifecycle,
    policy,
    send,
    read,
    tail,
    thread,
    history,
    dashboard,
    workbench,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="relay",
        description="relay: a Redis-backed broker that lets AI agents message each other over an\n"
        "authenticated MCP endpoint. Run `relay COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"relay {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (UsageError, InvalidArgument, SettingsError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    except (KeyFileError, AuthError) as exc:
        return _fail(str(exc), EXIT_RUNTIME)
    except RelayError as exc:
        return _fail(exc.message, EXIT_RUNTIME)


def _version() -> str:
    try:
        return version("relay")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _fail(message: str, code: int) -> int:
    print(f"relay: error: {' '.join(message.split())}", file=sys.stderr)
    return code
