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
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from broker.front.key_file import KeyFileError
from broker.front.paths import MCP_PATH
from broker.ids import check_agent_id, check_session_id
from relay import credential_file
from relay.claude_code import relay_http, waiter
from relay.claude_code.headers import HELPER_TTL_S, WAITER_TTL_S, minted
from relay.claude_code.relay_http import WAIT_PATH
from relay.claude_code.session import ClaudeProcess, NoSuchProcess
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
        description="Exchange the folder's credential file (--credential-file) at relay's /agent/token for "
        "the headers of the relay session of the Claude Code process PID (or of --session), and print the "
        "three headers as one JSON object (Claude Code's headersHelper format). Folders set up before "
        "per-agent credentials pass --key-file and --agent instead (the master key: re-run `relay setup "
        "claude-code` to stop that).",
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
    wait.add_argument(
        "--url", help=f"relay's agent endpoint (ending in {MCP_PATH}; default: the credential file's)"
    )
    for parser in (headers, wait):
        parser.add_argument(
            "--credential-file",
            type=Path,
            metavar="PATH",
            help="the agent folder's credential file (.relay/credential, from `relay setup claude-code`)",
        )
        parser.add_argument(
            "--key-file",
            type=Path,
            metavar="PATH",
            help="relay's signing key file (folders set up before credentials)",
        )
        parser.add_argument("--agent", help="agent id (with --key-file; the credential file names its own)")
    headers_session = headers.add_mutually_exclusive_group(required=True)
    pid_help = "the Claude Code process ($PPID in the hook's command line)"
    headers_session.add_argument("--claude-pid", type=bounded_int(2, 2**22), metavar="PID", help=pid_help)
    wait.add_argument("--claude-pid", type=bounded_int(2, 2**22), required=True, metavar="PID", help=pid_help)
    headers_session.add_argument(
        "--session", metavar="ID", help="the relay session id (instead of --claude-pid)"
    )
    headers.add_argument(
        "--ttl",
        type=bounded_int(1, 86_400, "seconds"),
        metavar="SECONDS",
        help=f"lifetime of the token (default: relay's, at most 900 s, for a credential file; {HELPER_TTL_S} "
        "with --key-file); Claude Code runs the helper again after a 401",
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


def _source(args: argparse.Namespace) -> str:
    """``credential`` or ``key``: which form of the command this is (``ValueError`` when neither)."""
    if (args.credential_file is None) == (args.key_file is None):
        raise ValueError(
            "pass --credential-file PATH (or, for an old set-up, --key-file PATH and --agent ID)"
        )
    if args.key_file is not None and args.agent is None:
        raise ValueError("--key-file needs --agent ID")
    if args.credential_file is not None and args.agent is not None:
        raise ValueError("--agent is for --key-file; the credential file names its agent")
    return "credential" if args.credential_file is not None else "key"


def _headers(args: argparse.Namespace) -> int:
    try:
        form = _source(args)
        session = (
            check_session_id(args.session, "--session")
            if args.session is not None
            else ClaudeProcess.of(args.claude_pid).session_id
        )
        if form == "credential":
            found = credential_file.load(args.credential_file)
            headers = credential_file.exchange(found, session, ttl=args.ttl)
        else:
            agent = check_agent_id(args.agent, "--agent")
            headers = minted(args.key_file, agent, session, args.ttl or HELPER_TTL_S)
            print(
                "relay: note: this folder's helper reads relay's master key; re-run `relay setup "
                "claude-code` here to give it its own credential",
                file=sys.stderr,
            )
        print(json.dumps(headers))
    except relay_http.Refused as exc:
        cause = f" ({exc.code})" if exc.code else ""
        print(f"relay: error: relay refused the credential{cause}: {exc.message or exc}", file=sys.stderr)
        return EXIT_HOOK_ERROR
    except (relay_http.Unavailable, NoSuchProcess, KeyFileError, ValueError) as exc:
        print(f"relay: error: {exc}", file=sys.stderr)
        return EXIT_HOOK_ERROR
    return 0


COPILOT_MARK: Final = "COPILOT_CLI"
"""Set in the environment of the hooks the Copilot CLI runs (1.0.102), which also runs the hooks of
Claude Code's ``.claude/settings*.json``, but in the foreground: Claude Code's waiter would hold its
session start until mail arrives (``tests/test_copilot.py``), so it steps aside there."""


def _wait(args: argparse.Namespace) -> int:
    if os.environ.get(COPILOT_MARK):
        print("relay hook wait: run by the Copilot CLI, which reads Claude Code's hooks; nothing to do")
        return waiter.EXIT_QUIET
    try:
        form = _source(args)
        if form == "credential":
            found = credential_file.load(args.credential_file)
            agent, url = found.agent, args.url or found.url
            headers: Callable[[str], Mapping[str, str]] = credential_file.Exchanger(args.credential_file)
        else:
            agent, url = check_agent_id(args.agent, "--agent"), args.url
            if url is None:
                raise ValueError("--key-file needs --url")
            key_file = args.key_file

            def headers(session: str) -> Mapping[str, str]:
                return minted(key_file, agent, session, WAITER_TTL_S)

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.path.endswith(MCP_PATH):
            raise ValueError(f"--url {url!r} is not an http(s) URL ending in {MCP_PATH}")
    except ValueError as exc:
        print(f"relay hook wait: {exc}")
        return waiter.EXIT_QUIET
    options = waiter.WaitOptions(
        agent=agent,
        mcp_url=url,
        wait_url=url.removesuffix(MCP_PATH) + WAIT_PATH,
        claude_pid=args.claude_pid,
        timeout_s=float(args.timeout),
        headers=headers,
    )
    return waiter.run(options, waiter.read_hook_input(sys.stdin), sys.stderr, sys.stdout)
