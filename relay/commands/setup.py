"""``relay setup CLIENT``: make a project folder ready for one coding agent. ``CLIENTS`` maps each
client's name to what it writes; ``claude-code`` keeps its own command (``relay.commands.claude_code``).

Every client's setup takes the same steps (``relay.folder_setup``): check that relay answers at
``--url``; merge relay's entries into the client's own config in memory (a malformed file is refused
and nothing is issued or written); issue a credential that acts only as ``--agent`` and write it to
``DIR/.relay/credential`` (0600); write the merged files; add what it created to ``.gitignore``; revoke
the folder's previous credential; print what it wrote and the one step the client asks of the user.
No file names relay's signing key.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from broker.errors import RelayError
from broker.front.paths import MCP_PATH
from broker.ids import check_agent_id
from relay import credential_file, logs
from relay.codex import setup as codex_setup
from relay.commands import UsageError, claude_code
from relay.commands.credentials import issue_credential, revoke_credentials, store_for
from relay.commands.signing import data_key_file, endpoint_url
from relay.copilot import setup as copilot_setup
from relay.folder_setup import CREDENTIAL_FILE, FolderRequest, SetupError, Written, check_folder, write_all
from relay.gemini import setup as gemini_setup
from relay.opencode import setup as opencode_setup
from relay.settings import DEFAULT_DATA_DIR, StoreSettings, add_options, load

if TYPE_CHECKING:
    from relay.commands import Subparsers


@dataclass(frozen=True, slots=True)
class Client:
    help: str
    description: str
    plan: Callable[[FolderRequest], dict[str, str]]
    """The client's files, merged (name relative to the folder → content); ``SetupError`` refuses."""
    lines: Callable[[FolderRequest, Written], list[str]]
    """What to tell the user once they are written."""


CLIENTS: dict[str, Client] = {
    "codex": Client(
        "set up a folder for one Codex agent (MCP server with a headers helper, wake hooks)",
        "Make DIR ready for one Codex agent: DIR/.codex/config.toml gets [mcp_servers.relay] (url, "
        "http_headers_helper exchanging the folder's credential for fresh headers), DIR/.codex/hooks.json "
        "gets SessionStart and SessionEnd hooks whose waiter wakes an idle session with `codex queue`.",
        codex_setup.plan,
        codex_setup.lines,
    ),
    "gemini": Client(
        "set up a folder for one Gemini CLI agent (MCP server, end-of-turn hook; then `relay run gemini`)",
        "Make DIR ready for one Gemini CLI agent: DIR/.gemini/settings.json gets mcpServers.relay (headers "
        "from ${RELAY_...} variables that `relay run gemini` fills) and an AfterAgent hook announcing mail "
        "at the end of each turn.",
        gemini_setup.plan,
        gemini_setup.lines,
    ),
    "copilot": Client(
        "set up a folder for one Copilot CLI agent (MCP server, end-of-turn hook; then `relay run copilot`)",
        "Make DIR ready for one Copilot CLI agent: DIR/.mcp.json gets the relay server with headers from "
        "${RELAY_...} variables that `relay run copilot` fills (a Claude Code headersHelper there is kept), "
        "DIR/.github/hooks/relay.json an agentStop hook announcing mail at the end of each turn.",
        copilot_setup.plan,
        copilot_setup.lines,
    ),
    "opencode": Client(
        "set up a folder for one opencode agent (remote MCP server, a plugin that mints headers and wakes)",
        "Make DIR ready for one opencode agent: DIR/opencode.json gets mcp.relay (remote), and "
        "DIR/.opencode/plugins/relay.js mints its headers at start and wakes an idle session with "
        "promptAsync when mail arrives.",
        opencode_setup.plan,
        opencode_setup.lines,
    ),
}


def register(subparsers: Subparsers) -> None:
    setup_parser = subparsers.add_parser("setup", help="make a project folder ready for an agent client")
    clients = setup_parser.add_subparsers(
        dest="client", metavar="CLIENT", required=True, parser_class=type(setup_parser)
    )
    claude_code.add_client(clients)
    for name, client in CLIENTS.items():
        parser = clients.add_parser(name, help=client.help, description=client.description)
        parser.add_argument(
            "--url",
            required=True,
            help=f"relay endpoint, e.g. http://127.0.0.1:8080{MCP_PATH} ({MCP_PATH} is appended to a bare "
            "host)",
        )
        parser.add_argument("--agent", required=True, help="agent id of this folder's agent, e.g. author")
        parser.add_argument(
            "--label", default="", help=f"label of the credential it issues (default: {name} DIR)"
        )
        parser.add_argument(
            "--dir", type=Path, metavar="DIR", help="the project folder (default: the current one)"
        )
        add_options(parser, StoreSettings)
        parser.set_defaults(handler=_setup, setup_client=name)


def _setup(args: argparse.Namespace) -> int:
    name: str = args.setup_client
    client = CLIENTS[name]
    url = endpoint_url(args.url)
    agent = check_agent_id(args.agent, "--agent")
    folder = Path(os.path.abspath(args.dir or Path.cwd()))
    request = FolderRequest(folder, agent, url, tuple(claude_code.relay_command()))
    try:
        check_folder(folder)
        files = client.plan(request)
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    settings = load(StoreSettings, args)
    warnings = []
    trouble = claude_code.answers(url)
    if trouble is not None:
        warnings.append(
            f"nothing answers at {url} ({trouble}): start relay serve there or fix --url; the folder "
            "works once relay answers at that URL"
        )
    if data_key_file(folder / DEFAULT_DATA_DIR).exists():
        warnings.append(
            f"{folder} is also a relay data dir: relay's master key there is readable by this agent; run "
            "relay serve from another folder"
        )
    path = request.credential_file
    new_credential = not path.exists()
    previous = claude_code.previous_credential(path)
    logs.audit_lines()
    record, text = issue_credential(
        store_for(settings, f"setup {name}"), agent, label=args.label or f"{name} {folder}"
    )
    credential_file.write(path, credential_file.CredentialFile(url, agent, text))
    written = write_all(folder, files, name, created=[CREDENTIAL_FILE] if new_credential else [])
    lines = client.lines(request, written)
    notes = [
        f"issued credential {record.id} for agent {agent} and wrote it to {path} (mode 0600): it acts "
        "only as this agent, and `relay credentials revoke` stops it"
    ]
    if previous is not None and previous != record.id:
        try:
            revoke_credentials(store_for(settings, f"setup {name}"), [previous], None)
            notes.append(f"revoked the folder's previous credential {previous}")
        except RelayError:
            pass  # issued by another relay's store: nothing of this relay to revoke
    lines[1:1] = [f"  note: {text}" for text in notes] + [f"  warning: {text}" for text in warnings]
    print("\n".join(lines))
    return 0
