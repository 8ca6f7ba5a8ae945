"""``relay hook headers`` and ``relay hook wait``: what Claude Code runs in a folder set up by
``relay setup claude-code`` (its MCP ``headersHelper`` and its ``asyncRewake`` hook).

Claude Code runs these at every MCP connection and every turn, and gives a ``headersHelper`` 10 s: this
module imports nothing heavy, and ``relay.entry`` reaches it without importing the other commands.
``relay hook wait`` exits 2 for mail, and once when its ``--timeout`` passes, to be armed again (exit 2
from an ``asyncRewake`` hook wakes the session); every other outcome, a bad command line included, is
exit 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from broker.front.key_file import KeyFileError
from broker.front.paths import MCP_PATH
from broker.ids import check_agent_id
from relay.claude_code import waiter
from relay.claude_code.headers import HELPER_TTL_S, WAITER_TTL_S, for_claude, minted
from relay.claude_code.relay_http import WAIT_PATH
from relay.claude_code.session import NoSuchProcess
from relay.commands import Parser, bounded_int, hook_clients

if TYPE_CHECKING:
    from relay.commands import Subparsers

EXIT_HOOK_ERROR: Final = 1


class _HookParser(Parser):
    """A bad command line exits 1, never 2 (which would wake the session)."""

    usage_exit = EXIT_HOOK_ERROR


def register(subparsers: Subparsers) -> None:
    hook = subparsers.add_parser(
        "hook",
        help="commands Claude Code runs in a folder set up by `relay setup claude-code`",
        description="Commands Claude Code runs in a folder set up by `relay setup claude-code`; "
        "$PPID in their command line is the Claude Code process, which names the relay session.",
    )
    _add_commands(hook)


def main(argv: Sequence[str]) -> int:
    """``relay hook ARGV`` on its own parser (``relay.entry`` calls this without building the rest)."""
    parser = _HookParser(prog="relay hook", description="Commands Claude Code runs (see `relay --help`).")
    _add_commands(parser)
    args = parser.parse_args(argv)
    result: int = args.handler(args)
    return result


def _add_commands(hook: argparse.ArgumentParser) -> None:
    commands = hook.add_subparsers(dest="hook", metavar="COMMAND", required=True, parser_class=_HookParser)
    headers = commands.add_parser(
        "headers",
        help="print fresh agent headers for a Claude Code session (its MCP headersHelper)",
        description="Mint a token for AGENT and the relay session of the Claude Code process PID, and "
        "print the three headers as one JSON object (Claude Code's headersHelper format).",
    )
    wait = commands.add_parser(
        "wait",
        help="wait for mail and wake the Claude Code session (its asyncRewake hook)",
        description="Read the hook's JSON on stdin; at SessionStart register the session; then block on "
        "relay's mail-pending wait. New mail: print a summary on stderr and exit 2 (Claude Code wakes the "
        "session). --timeout passed: say so on stderr and exit 2, so that the turn's Stop hook waits again. "
        "A refusal, a replaced waiter or a finished session: exit 0, silent. A relay that is down is "
        "retried quietly with backoff.",
    )
    wait.add_argument("--url", required=True, help=f"relay's agent endpoint (ending in {MCP_PATH})")
    for parser in (headers, wait):
        parser.add_argument("--key-file", type=Path, required=True, metavar="PATH", help="signing key file")
        parser.add_argument("--agent", required=True, help="agent id")
        parser.add_argument(
            "--claude-pid",
            type=bounded_int(2, 2**22),
            required=True,
            metavar="PID",
            help="the Claude Code process ($PPID in the hook's command line)",
        )
    headers.add_argument(
        "--ttl",
        type=bounded_int(1, 86_400, "seconds"),
        default=HELPER_TTL_S,
        metavar="SECONDS",
        help=f"lifetime of the token (default {HELPER_TTL_S}; Claude Code runs the helper again after a 401)",
    )
    wait.add_argument(
        "--timeout",
        type=bounded_int(1, 30 * 86_400, "seconds"),
        default=3600,
        metavar="SECONDS",
        help="after this long with no mail, wake the session once to be armed again (default 3600; keep it "
        "below the hook's timeout)",
    )
    headers.set_defaults(handler=_headers)
    wait.set_defaults(handler=_wait)
    hook_clients.add_commands(commands)


def _headers(args: argparse.Namespace) -> int:
    try:
        agent = check_agent_id(args.agent, "--agent")
        print(json.dumps(for_claude(args.key_file, agent, args.claude_pid, args.ttl)))
    except (NoSuchProcess, KeyFileError, ValueError) as exc:
        print(f"relay: error: {exc}", file=sys.stderr)
        return EXIT_HOOK_ERROR
    return 0


def _wait(args: argparse.Namespace) -> int:
    try:
        agent = check_agent_id(args.agent, "--agent")
        parts = urlsplit(args.url)
        if parts.scheme not in ("http", "https") or not parts.path.endswith(MCP_PATH):
            raise ValueError(f"--url {args.url!r} is not an http(s) URL ending in {MCP_PATH}")
    except ValueError as exc:
        print(f"relay hook wait: {exc}")
        return waiter.EXIT_QUIET
    options = waiter.WaitOptions(
        agent=agent,
        mcp_url=args.url,
        wait_url=args.url.removesuffix(MCP_PATH) + WAIT_PATH,
        claude_pid=args.claude_pid,
        timeout_s=float(args.timeout),
        headers=lambda session: minted(args.key_file, agent, session, WAITER_TTL_S),
    )
    return waiter.run(options, waiter.read_hook_input(sys.stdin), sys.stderr, sys.stdout)
