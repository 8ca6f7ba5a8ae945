"""``relay setup gemini``: make a project folder ready for one Gemini CLI agent (Gemini CLI 0.61).

One file in the folder, relay's entries merged into what is there: ``.gemini/settings.json`` gets

- ``mcpServers.relay``: ``httpUrl`` and ``headers`` whose values are ``${RELAY_...}`` references, which
  Gemini CLI expands from its environment at each connection. Gemini CLI runs no headers helper, so
  ``relay run gemini`` (``relay.launch``) exchanges the folder's credential for a token, puts the
  headers in the environment and execs ``gemini``: no token is stored in any file, and the token lives
  as long as relay's exchanged tokens (``TOKEN_LIFETIME_NOTE``); Gemini CLI cannot refresh it.
- ``hooks.AfterAgent``: ``relay hook after-turn`` at the end of every turn, which announces mail that arrived
  during the turn (exit 2: Gemini CLI makes the summary its next prompt). Gemini CLI has no way to wake
  an idle session from outside, so the hook waits only ``AFTER_AGENT_WAIT_S`` (a blocking hook holds
  the user's typed input back while it runs).

Gemini CLI ignores a project's MCP servers and hooks in an untrusted folder: trusting it is the step
left to the user.
"""

from __future__ import annotations

import re
import shlex
from typing import Final

from relay.folder_setup import (
    ENV_SESSION,
    SERVER_NAME,
    FolderRequest,
    Written,
    check_folder,
    json_object,
    json_text,
    load_json,
    merge_hooks,
    variable_headers,
)

SETTINGS_FILE: Final = ".gemini/settings.json"
HOOK_EVENTS: Final = ("AfterAgent",)
AFTER_AGENT_WAIT_S: Final = 2
"""How long the end-of-turn hook waits for mail before the session goes idle without it."""
HOOK_TIMEOUT_MS: Final = (AFTER_AGENT_WAIT_S + 28) * 1000
"""The hook's ``timeout`` (milliseconds): Gemini CLI stops it after this (60 s when unset)."""
_OURS: Final = re.compile(r"\bhook after-turn\b.*--credential-file")


def waiter_command(request: FolderRequest) -> str:
    argv = request.relay_argv("hook", "after-turn", "--credential-file", str(request.credential_file))
    return shlex.join([*argv, "--session-env", ENV_SESSION, "--timeout", str(AFTER_AGENT_WAIT_S)])


def lines(request: FolderRequest, written: Written) -> list[str]:
    """What to tell the user: what was written, how to start Gemini CLI, what it still asks."""
    folder = request.folder
    lines = [f"relay: set up Gemini CLI in {folder} for agent {request.agent} at {request.mcp_url}"]
    lines.append(
        f'  {written.verb(SETTINGS_FILE)} {SETTINGS_FILE}: MCP server "{SERVER_NAME}" (httpUrl, headers '
        "from ${RELAY_...} variables, no token in any file) and an AfterAgent hook (`relay hook after-turn`) "
        "that announces mail arriving during a turn when the turn ends"
    )
    lines += written.lines()
    lines += [
        f"Start Gemini CLI in {folder} with `relay run gemini [ARGS...]`: it exchanges the folder's",
        "credential for a token, puts the headers in gemini's environment and runs `gemini`.",
        "The token cannot be refreshed in a running Gemini CLI: it lasts relay's exchange lifetime",
        "(15 minutes); start the session again (`relay run gemini --resume latest`) after that.",
        "Gemini CLI cannot be woken while idle: mail is announced at the end of the next turn.",
        f"Gemini CLI asks one thing of you, once: trust {folder} when it asks (until then it ignores",
        f"{SETTINGS_FILE}). Then `relay run gemini mcp list` shows `{SERVER_NAME}` Connected.",
    ]
    return lines


def plan(request: FolderRequest) -> dict[str, str]:
    """The settings file merged (see the module docstring), written by the caller; ``SetupError`` when
    it is not what Gemini CLI reads."""
    folder = request.folder
    check_folder(folder)
    settings = load_json(folder / SETTINGS_FILE)
    servers = json_object(settings, "mcpServers", SETTINGS_FILE)
    servers[SERVER_NAME] = {
        "httpUrl": request.mcp_url,
        "headers": variable_headers(),
    }
    hooks = json_object(settings, "hooks", SETTINGS_FILE)
    entry = {"type": "command", "command": waiter_command(request), "timeout": HOOK_TIMEOUT_MS}
    merge_hooks(hooks, HOOK_EVENTS, entry, _OURS, SETTINGS_FILE)
    return {SETTINGS_FILE: json_text(settings)}
