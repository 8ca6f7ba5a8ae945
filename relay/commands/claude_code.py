"""``relay setup claude-code``: the command-line wiring of ``relay.claude_code.setup``."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from broker.credentials import split
from broker.errors import RelayError
from broker.front.paths import MCP_PATH
from broker.ids import check_agent_id
from relay import credential_file, logs
from relay.claude_code.setup import SetupError, SetupRequest, check, setup
from relay.commands import UsageError
from relay.commands.credentials import issue_credential, revoke_credentials, store_for
from relay.commands.signing import data_key_file, endpoint_url
from relay.settings import DEFAULT_DATA_DIR, StoreSettings, add_options, load

if TYPE_CHECKING:
    from relay.commands import Subparsers


def relay_command() -> list[str]:
    """How to run this ``relay`` from any folder: the console script by its absolute path, else this
    Python (the venv's, not resolved through its link) with ``-m relay``."""
    script = Path(sys.argv[0])
    if script.name == "relay" and script.is_file() and os.access(script, os.X_OK):
        return [os.path.abspath(script)]
    return [os.path.abspath(sys.executable), "-m", "relay"]


def add_client(clients: Subparsers) -> None:
    """``relay setup claude-code`` (``relay.commands.setup`` lists the other clients)."""
    parser = clients.add_parser(
        "claude-code",
        help="set up a folder for one Claude Code agent (MCP server, wake hooks)",
        description="Make DIR ready for one Claude Code agent: a credential that acts only as AGENT is "
        "issued (relay must be running: its store is written) and kept in DIR/.relay/credential (mode 0600, "
        "git-ignored); DIR/.mcp.json gets the relay MCP server (headers exchanged for that credential at "
        "each connection by `relay hook headers`; no token, and no path to relay's signing key, in any "
        "file), and "
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
        "--label", default="", help="label of the credential it issues (default: claude-code DIR)"
    )
    parser.add_argument(
        "--dir", type=Path, metavar="DIR", help="the project folder (default: the current one)"
    )
    add_options(parser, StoreSettings)
    parser.set_defaults(handler=_setup_claude_code)


def answers(url: str, timeout: float = 3.0) -> str | None:
    """None when relay answers ``/healthz`` beside ``url``; else what went wrong, for a warning."""
    probe = url.removesuffix(MCP_PATH) + "/healthz"
    try:
        with _OPENER.open(probe, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _setup_claude_code(args: argparse.Namespace) -> int:
    url = endpoint_url(args.url)
    agent = check_agent_id(args.agent, "--agent")
    folder = Path(os.path.abspath(args.dir or Path.cwd()))
    path = credential_file.path_in(folder)
    request = SetupRequest(folder, agent, url, path, relay_command())
    try:
        check(request)
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    settings = load(StoreSettings, args)
    warnings = []
    trouble = answers(url)
    if trouble is not None:
        warnings.append(
            f"nothing answers at {url} ({trouble}): start relay serve there or fix --url; the folder "
            "works once relay answers at that URL"
        )
    master = data_key_file(folder / DEFAULT_DATA_DIR)
    if master.exists():
        warnings.append(
            f"{folder} is also a relay data dir: its {master.name} (relay's master key) is readable by "
            "this agent; run relay serve from another folder"
        )
    previous = previous_credential(path)
    logs.audit_lines()
    store = store_for(settings, "setup claude-code")
    record, text = issue_credential(store, agent, label=args.label or f"claude-code {folder}")
    credential_file.write(path, credential_file.CredentialFile(url, agent, text))
    try:
        report = setup(request)
    except SetupError as exc:
        revoke_credentials(store_for(settings, "setup claude-code"), [record.id], None)
        raise UsageError(str(exc)) from None
    report.warnings += warnings
    report.notes.insert(
        0,
        f"issued credential {record.id} for agent {agent} and wrote it to {path} (mode 0600): it acts "
        "only as this agent, and `relay credentials revoke` stops it",
    )
    if previous is not None and previous != record.id:
        try:
            revoke_credentials(store_for(settings, "setup claude-code"), [previous], None)
            report.notes.append(f"revoked the folder's previous credential {previous}")
        except RelayError:
            pass  # issued by another relay's store: nothing of this relay to revoke
    print("\n".join(report.lines()))
    return 0


def previous_credential(path: Path) -> str | None:
    """The id of the credential the folder held before, if any."""
    try:
        found = credential_file.load(path)
    except credential_file.CredentialFileError:
        return None
    parts = split(found.credential)
    return parts[0] if parts else None
