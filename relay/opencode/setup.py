"""``relay setup opencode``: make a project folder ready for one opencode agent (opencode 1.18.33).

Two files in the folder:

- ``opencode.json``: ``mcp.relay``, a ``remote`` server with ``url`` and ``oauth: false``; its headers
  come from the plugin, not the file. The user's other entries are kept.
- ``.opencode/plugins/relay.js`` (relay's own file, ``plugin.js`` with this machine's ``relay`` command
  and the folder's credential file filled in): mints the headers in its ``config`` hook and, at
  ``session.created``, starts ``relay hook wake-stream``, whose lines it hands to the idle session with
  ``client.session.promptAsync``: mail wakes an idle opencode session.

opencode asks no trust question for a project's config or plugins: nothing is left to the user but to
start ``opencode`` in the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from relay.folder_setup import (
    SERVER_NAME,
    FolderRequest,
    Written,
    check_folder,
    json_object,
    json_text,
    load_json,
)

CONFIG_FILE: Final = "opencode.json"
PLUGIN_FILE: Final = ".opencode/plugins/relay.js"
_TEMPLATE: Final = Path(__file__).with_name("plugin.js")


def plugin_source(request: FolderRequest) -> str:
    """The plugin with this folder's ``relay`` command and credential file (as JavaScript literals)."""
    source = _TEMPLATE.read_text()
    source = source.replace("__RELAY_ARGV__", json.dumps(list(request.relay)))
    return source.replace("__CREDENTIAL_FILE__", json.dumps(str(request.credential_file)))


def lines(request: FolderRequest, written: Written) -> list[str]:
    """What to tell the user: what was written, and how to start opencode."""
    lines = [f"relay: set up opencode in {request.folder} for agent {request.agent} at {request.mcp_url}"]
    lines.append(
        f'  {written.verb(CONFIG_FILE)} {CONFIG_FILE}: MCP server "{SERVER_NAME}" (remote, oauth off); its '
        "headers come from the plugin, no token in any file"
    )
    lines.append(
        f"  {written.verb(PLUGIN_FILE)} {PLUGIN_FILE}: mints the headers when opencode starts and wakes an "
        "idle session when mail arrives (promptAsync)"
    )
    lines += written.lines()
    lines += [
        f"Start `opencode` in {request.folder}; opencode asks nothing more. `opencode mcp list` there shows",
        f"`{SERVER_NAME}` connected. The headers are minted once per opencode process and last relay's",
        "exchange lifetime (15 minutes): restart opencode after that for relay's tools.",
    ]
    return lines


def plan(request: FolderRequest) -> dict[str, str]:
    """Both files (see the module docstring), written by the caller; ``SetupError`` when the existing
    ``opencode.json`` is not a JSON object (or its ``mcp`` is not one)."""
    folder = request.folder
    check_folder(folder)
    config = load_json(folder / CONFIG_FILE)
    config.setdefault("$schema", "https://opencode.ai/config.json")
    servers = json_object(config, "mcp", CONFIG_FILE)
    servers[SERVER_NAME] = {"type": "remote", "url": request.mcp_url, "oauth": False, "enabled": True}
    return {CONFIG_FILE: json_text(config), PLUGIN_FILE: plugin_source(request)}
