"""``relay setup copilot``: make a project folder ready for one Copilot CLI agent (Copilot CLI 1.0.102).

Two files in the folder:

- ``.mcp.json``: the ``relay`` server (``type: http``, ``url``) with ``headers`` whose values are
  ``${RELAY_...:-}`` references, which the Copilot CLI expands from its environment at each connection
  (``relay run copilot`` exchanges the folder's credential and puts them there). The Copilot CLI reads
  the same file as Claude Code and ignores ``headersHelper``; the entry keeps a ``headersHelper`` that
  ``relay setup claude-code`` wrote (and that setup keeps these headers), so one folder works in both:
  Claude Code runs the helper, whose headers replace the empty ones (``:-``: an unset variable is no
  error there), and the Copilot CLI sends the variables. The user's other servers are kept.
- ``.github/hooks/relay.json``: relay's own hook file, an ``agentStop`` hook running ``relay hook
  after-turn --answer decision``: at the end of each turn it waits briefly for mail and, with some,
  answers ``{"decision": "block", "reason": <summary>}``, which the CLI submits as the next prompt. The
  Copilot CLI has no way to wake an idle session from outside (none was found).

The Copilot CLI reads workspace config only in a trusted folder: trusting it is the step left to the user.
"""

from __future__ import annotations

import shlex
from typing import Any, Final

from relay.folder_setup import (
    ENV_SESSION,
    SERVER_NAME,
    FolderRequest,
    SetupError,
    Written,
    check_folder,
    json_object,
    json_text,
    load_json,
    variable_headers,
)

MCP_FILE: Final = ".mcp.json"
HOOKS_FILE: Final = ".github/hooks/relay.json"
AFTER_TURN_WAIT_S: Final = 2
"""How long the end-of-turn hook waits for mail before the session goes idle without it."""
HOOK_TIMEOUT_S: Final = AFTER_TURN_WAIT_S + 28


def hook_command(request: FolderRequest) -> str:
    argv = request.relay_argv("hook", "after-turn", "--credential-file", str(request.credential_file))
    argv += ["--session-env", ENV_SESSION, "--timeout", str(AFTER_TURN_WAIT_S), "--answer", "decision"]
    return shlex.join(argv)


def lines(request: FolderRequest, written: Written) -> list[str]:
    """What to tell the user: what was written, how to start the CLI, what it still asks."""
    folder = request.folder
    lines = [f"relay: set up the Copilot CLI in {folder} for agent {request.agent} at {request.mcp_url}"]
    lines.append(
        f'  {written.verb(MCP_FILE)} {MCP_FILE}: MCP server "{SERVER_NAME}" (type http, headers from '
        "${RELAY_...} variables, no token in any file; a Claude Code headersHelper there is kept)"
    )
    lines.append(
        f"  {written.verb(HOOKS_FILE)} {HOOKS_FILE}: an agentStop hook (`relay hook after-turn`) that "
        "announces mail arriving during a turn when the turn ends"
    )
    lines += written.lines()
    lines += [
        f"Start the Copilot CLI in {folder} with `relay run copilot [ARGS...]`: it exchanges the folder's",
        "credential for a token and puts the headers in copilot's environment. The token cannot be",
        "refreshed in a running Copilot CLI: it lasts relay's exchange lifetime (15 minutes); start the",
        "session again after that. The Copilot CLI cannot be woken while idle: mail is announced at the",
        f"end of the next turn. It asks one thing of you, once: trust {folder} when it asks (until then",
        f"it ignores {MCP_FILE} and the hooks). `/mcp` in the session then shows `{SERVER_NAME}` connected.",
    ]
    return lines


def plan(request: FolderRequest) -> dict[str, str]:
    """Both files merged (see the module docstring), written by the caller; ``SetupError`` when the
    existing ``.mcp.json`` is not what the CLIs read."""
    folder = request.folder
    check_folder(folder)
    mcp = load_json(folder / MCP_FILE)
    servers = json_object(mcp, "mcpServers", MCP_FILE)
    previous = servers.get(SERVER_NAME)
    entry: dict[str, Any] = {
        "type": "http",
        "url": request.mcp_url,
        "headers": variable_headers(empty_default=True),
    }
    if isinstance(previous, dict) and isinstance(previous.get("headersHelper"), str):
        if previous.get("url") not in (None, request.mcp_url):
            raise SetupError(
                f"{MCP_FILE}: relay's entry is set up for Claude Code at {previous['url']}, not "
                f"{request.mcp_url}; set both up with the same --url"
            )
        entry["headersHelper"] = previous["headersHelper"]
    servers[SERVER_NAME] = entry
    load_json(folder / HOOKS_FILE)  # refuse a malformed one before anything is written
    hook = {"type": "command", "bash": hook_command(request), "timeoutSec": HOOK_TIMEOUT_S}
    hooks = {"version": 1, "hooks": {"agentStop": [hook]}}
    return {MCP_FILE: json_text(mcp), HOOKS_FILE: json_text(hooks)}
