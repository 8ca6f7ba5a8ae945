"""``relay setup claude-code`` and the two commands it installs for Claude Code (``relay hook headers``,
``relay hook wait``): the command-line wiring of ``relay.claude_code``.

``relay hook wait`` runs as an ``asyncRewake`` hook, where exit code 2 wakes the session: so it exits 2
only for mail, and every other outcome, a bad command line included, is exit 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

from broker.front.app import MCP_PATH
from broker.front.key_file import load_key_file
from broker.ids import check_agent_id
from relay.claude_code import waiter
from relay.claude_code.headers import WAITER_TTL_S, for_claude, minted
from relay.claude_code.relay_http import WAIT_PATH
from relay.claude_code.session import NoSuchProcess
from relay.claude_code.setup import SetupError, SetupRequest, setup
from relay.commands import UsageError, bounded_int
from relay.commands.keys import endpoint_url
from relay.settings import DEFAULT_DATA_DIR

if TYPE_CHECKING:
    from relay.commands import Subparsers

DEFAULT_KEY_NAME: Final = "agent-mcp.key"
EXIT_HOOK_USAGE: Final = 1


def default_key_file() -> Path:
    """The data dir's signing key (``$RELAY_DATA_DIR`` or ``./.relay``)."""
    return Path(os.environ.get("RELAY_DATA_DIR") or DEFAULT_DATA_DIR) / DEFAULT_KEY_NAME


def relay_command() -> list[str]:
    """How to run this ``relay`` from any folder: the console script by its absolute path, else this
    Python (the venv's, not resolved through its link) with ``-m``."""
    script = Path(sys.argv[0])
    if script.name == "relay" and script.is_file() and os.access(script, os.X_OK):
        return [os.path.abspath(script)]
    return [os.path.abspath(sys.executable), "-m", "relay"]


# --- relay setup claude-code ---------------------------------------------------------------------------


def register(subparsers: Subparsers) -> None:
    _register_setup(subparsers)
    _register_hook(subparsers)


def _register_setup(subparsers: Subparsers) -> None:
    setup = subparsers.add_parser("setup", help="make a project folder ready for an agent client")
    clients = setup.add_subparsers(dest="client", metavar="CLIENT", required=True)
    parser = clients.add_parser(
        "claude-code",
        help="set up a folder for one Claude Code agent (MCP server, wake hooks)",
        description="Make DIR ready for one Claude Code agent: DIR/.mcp.json gets the relay MCP server "
        "(headers minted at each connection by `relay hook headers`; no token in any file), and "
        "DIR/.claude/settings.local.json gets SessionStart and Stop hooks running `relay hook wait`, "
        "which wake an idle session when mail arrives. Each Claude Code session gets its own relay "
        "session. Re-running updates relay's own entries and leaves everything else alone.",
    )
    parser.add_argument(
        "--url",
        required=True,
        help=f"relay endpoint, e.g. http://127.0.0.1:8080{MCP_PATH} (bare host accepted)",
    )
    parser.add_argument("--agent", required=True, help="agent id of this folder's Claude Code, e.g. author")
    parser.add_argument(
        "--key-file",
        type=Path,
        metavar="PATH",
        help=f"the signing key relay serves with (default: the data dir's, {default_key_file()})",
    )
    parser.add_argument(
        "--dir", type=Path, metavar="DIR", help="the project folder (default: the current one)"
    )
    parser.set_defaults(handler=_setup_claude_code)


def _setup_claude_code(args: argparse.Namespace) -> int:
    url = endpoint_url(args.url)
    agent = check_agent_id(args.agent, "--agent")
    key_file = Path(os.path.abspath(args.key_file or default_key_file()))
    load_key_file(key_file)
    folder = Path(os.path.abspath(args.dir or Path.cwd()))
    try:
        report = setup(SetupRequest(folder, agent, url, key_file, relay_command()))
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    print("\n".join(report.lines()))
    return 0


# --- relay hook headers / wait ------------------------------------------------------------------------


class _HookParser(argparse.ArgumentParser):
    """A hook's bad command line exits 1: exit 2 from an ``asyncRewake`` hook would wake the session."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_HOOK_USAGE, f"relay: error: {message}; see `{self.prog} --help`\n")


def _register_hook(subparsers: Subparsers) -> None:
    hook = subparsers.add_parser(
        "hook",
        help="commands Claude Code runs in a folder set up by `relay setup claude-code`",
        description="Commands Claude Code runs in a folder set up by `relay setup claude-code`; "
        "$PPID in their command line is the Claude Code process, which names the relay session.",
    )
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
        "session). Timeout, a refusal, a replaced waiter or a finished session: exit 0, silent. A relay "
        "that is down is retried quietly with backoff.",
    )
    wait.add_argument("--url", required=True, help="relay's agent MCP endpoint")
    for parser in (headers, wait):
        parser.add_argument("--key-file", type=Path, required=True, metavar="PATH", help="signing key file")
        parser.add_argument("--agent", required=True, help="agent id")
        parser.add_argument(
            "--claude-pid",
            type=bounded_int(2, 2**22, ""),
            required=True,
            metavar="PID",
            help="the Claude Code process ($PPID in the hook's command line)",
        )
    wait.add_argument(
        "--timeout",
        type=bounded_int(1, 30 * 86_400, "seconds"),
        default=3600,
        metavar="SECONDS",
        help="leave quietly after this long (default 3600; set below the hook's timeout)",
    )
    headers.set_defaults(handler=_hook_headers)
    wait.set_defaults(handler=_hook_wait)


def _hook_headers(args: argparse.Namespace) -> int:

    try:
        print(json.dumps(for_claude(args.key_file, check_agent_id(args.agent, "--agent"), args.claude_pid)))
    except NoSuchProcess as exc:
        raise UsageError(f"--claude-pid: {exc}") from None
    return 0


def _hook_wait(args: argparse.Namespace) -> int:

    try:
        url = endpoint_url(args.url)
        agent = check_agent_id(args.agent, "--agent")
    except Exception as exc:  # never exit 2 from this hook: that wakes the session
        print(f"relay hook wait: {exc}")
        return 0
    options = waiter.WaitOptions(
        agent=agent,
        mcp_url=url,
        wait_url=url.removesuffix(MCP_PATH) + WAIT_PATH,
        claude_pid=args.claude_pid,
        timeout_s=float(args.timeout),
        headers=lambda session: minted(args.key_file, agent, session, WAITER_TTL_S),
    )
    return waiter.run(options, waiter.read_hook_input(sys.stdin), sys.stderr, sys.stdout)
