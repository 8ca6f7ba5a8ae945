"""``relay setup claude-code``: the command-line wiring of ``relay.claude_code.setup``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from broker.front.key_file import load_key_file
from broker.front.paths import MCP_PATH
from broker.ids import check_agent_id
from relay.claude_code.setup import SetupError, SetupRequest, setup
from relay.commands import UsageError
from relay.commands.keys import data_key_file, endpoint_url
from relay.settings import DEFAULT_DATA_DIR

if TYPE_CHECKING:
    from relay.commands import Subparsers


def default_key_file() -> Path:
    """The data dir's signing key (``$RELAY_DATA_DIR`` or ``./.relay``), which ``relay serve`` creates."""
    return data_key_file(Path(os.environ.get("RELAY_DATA_DIR") or DEFAULT_DATA_DIR))


def relay_command() -> list[str]:
    """How to run this ``relay`` from any folder: the console script by its absolute path, else this
    Python (the venv's, not resolved through its link) with ``-m relay``."""
    script = Path(sys.argv[0])
    if script.name == "relay" and script.is_file() and os.access(script, os.X_OK):
        return [os.path.abspath(script)]
    return [os.path.abspath(sys.executable), "-m", "relay"]


def register(subparsers: Subparsers) -> None:
    setup_parser = subparsers.add_parser("setup", help="make a project folder ready for an agent client")
    clients = setup_parser.add_subparsers(
        dest="client", metavar="CLIENT", required=True, parser_class=type(setup_parser)
    )
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
        help=f"relay endpoint, e.g. http://127.0.0.1:8080{MCP_PATH} ({MCP_PATH} is appended to a bare host)",
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
