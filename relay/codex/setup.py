"""``relay setup codex``: make a project folder ready for one Codex agent (Codex 0.171).

Two files in the folder, relay's entries merged into what is there:

- ``.codex/config.toml``: the ``[mcp_servers.relay]`` table, ``url`` and ``http_headers_helper``. Codex
  runs the helper (through a shell) at each connection; it exchanges the folder's credential for fresh
  agent headers (``relay hook headers --credential-file ... --session ...``), so no token is stored.
- ``.codex/hooks.json``: ``SessionStart`` and ``SessionEnd`` command hooks running ``relay hook codex``,
  which start (and stop) the waiter that wakes an idle session with ``codex queue`` (``relay.codex.waiter``).

Which relay session a Codex session is: Codex runs the helper in a shared ``codex app-server`` daemon and
hands it no session id, so neither ``$PPID`` nor the environment names the session. The folder does:
one Codex agent per folder, one relay session per folder (``session_id``, derived from the folder's
path), which the helper and the hooks both pass. A new Codex session in the folder takes the session
over (its ``SessionStart`` re-registers it and replaces the waiter, which then wakes the new thread).

Codex reads a project's ``.codex/config.toml`` only once the user trusts the project, and runs project
hooks only once they are trusted in a session: setup says so, that is the step left to the user.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from typing import Final

from relay.folder_setup import (
    SERVER_NAME,
    FolderRequest,
    Written,
    check_folder,
    json_object,
    json_text,
    load_json,
    merge_hooks,
    merge_toml_table,
)

CONFIG_FILE: Final = ".codex/config.toml"
HOOKS_FILE: Final = ".codex/hooks.json"
HOOK_EVENTS: Final = ("SessionStart", "SessionEnd")
SESSION_PREFIX: Final = "codex-"
_OURS: Final = re.compile(r"\bhook codex\b.*--credential-file")


def session_id(request: FolderRequest) -> str:
    """The relay session of the folder's Codex agent: stable for the folder, different for another."""
    digest = hashlib.sha256(str(request.folder).encode()).hexdigest()[:16]
    return f"{SESSION_PREFIX}{digest}"


def codex_command() -> str:
    """The ``codex`` the waiter runs (``codex queue``): the one on ``PATH`` now, else ``codex``."""
    return shutil.which("codex") or "codex"


def helper_command(request: FolderRequest) -> str:
    argv = request.relay_argv("hook", "headers", "--credential-file", str(request.credential_file))
    return shlex.join([*argv, "--session", session_id(request)])


def hook_command(request: FolderRequest, codex: str) -> str:
    argv = request.relay_argv("hook", "codex", "--credential-file", str(request.credential_file))
    return f"{shlex.join([*argv, '--session', session_id(request), '--codex', codex])} --watch-pid $PPID"


def lines(request: FolderRequest, written: Written) -> list[str]:
    """What to tell the user: what was written, and what Codex still asks of them."""
    lines = [f"relay: set up Codex in {request.folder} for agent {request.agent} at {request.mcp_url}"]
    lines.append(
        f'  {written.verb(CONFIG_FILE)} {CONFIG_FILE}: MCP server "{SERVER_NAME}" (url, '
        "http_headers_helper); the helper exchanges the folder's credential for fresh headers at each "
        "connection, so no token is stored in any file"
    )
    lines.append(
        f"  {written.verb(HOOKS_FILE)} {HOOKS_FILE}: SessionStart and SessionEnd hooks (`relay hook codex`) "
        "start a waiter that wakes the idle session with `codex queue` when mail arrives"
    )
    lines += written.lines()
    lines += [
        "Codex asks two things of you, once for this folder. Run `codex` in",
        f"{request.folder}: trust the folder when it asks (until then Codex does not read",
        f'{CONFIG_FILE}), then answer the hooks review with "Trust all and continue" (until then the',
        "hooks do not run and nothing wakes the session). `/mcp` in the session then shows",
        f"`{SERVER_NAME}` connected with its six tools while relay serves {request.mcp_url}.",
    ]
    return lines


def plan(request: FolderRequest) -> dict[str, str]:
    """Both files merged (see the module docstring), written by the caller; ``SetupError`` when an
    existing file is not what Codex reads."""
    folder = request.folder
    check_folder(folder)
    config = merge_toml_table(
        folder / CONFIG_FILE,
        ("mcp_servers", SERVER_NAME),
        {"url": request.mcp_url, "http_headers_helper": helper_command(request)},
    )
    hooks_file = load_json(folder / HOOKS_FILE)
    hooks = json_object(hooks_file, "hooks", HOOKS_FILE)
    entry = {"type": "command", "command": hook_command(request, codex_command())}
    merge_hooks(hooks, HOOK_EVENTS, entry, _OURS, HOOKS_FILE)
    return {CONFIG_FILE: config, HOOKS_FILE: json_text(hooks_file)}
