"""``relay setup claude-code``: make a project folder ready for one Claude Code agent.

It writes two files in the folder, merging into what is there and touching only relay's own entries
(the caller has written the third, the folder's credential file, ``relay.credential_file``):

- ``.mcp.json``: the ``relay`` MCP server (type ``http``) whose ``headersHelper`` runs
  ``relay hook headers --credential-file``, which exchanges the folder's credential for fresh agent
  headers at each connection; no token is stored.
- ``.claude/settings.local.json``: ``SessionStart`` and ``Stop`` command hooks with ``asyncRewake``
  running ``relay hook wait`` (the waiter that wakes an idle session), and ``relay`` in
  ``enabledMcpjsonServers`` (the project server approved for this folder).

Both commands get ``$PPID`` (the Claude Code process, see ``claude_code.session``), so the helper and
the hooks agree on the session without any shared state. Neither file holds a secret or names relay's
signing key; both name this machine's relay command and the credential file, so a file the command
creates, and the credential file, are added to the folder's ``.gitignore`` when git does not already
ignore them. Bad input (a file that is not a JSON object) changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from relay.folder_setup import variable_headers

SERVER_NAME: Final = "relay"
HOOK_EVENTS: Final = ("SessionStart", "Stop")
HOOK_TIMEOUT_S: Final = 2_147_483
"""The hooks' ``timeout``: Claude Code stops a hook after it (600 s when unset). About 24.8 days, the
longest whole number of seconds a 32-bit millisecond timer holds (JavaScript timers of that width fire
at once past it)."""
WAITER_TIMEOUT_S: Final = HOOK_TIMEOUT_S - 60
"""A minute before Claude Code would stop it, the waiter wakes the session once to be armed again by the
turn's ``Stop`` hook (``relay.claude_code.waiter``): the session stays reachable while it runs."""
MCP_FILE: Final = ".mcp.json"
SETTINGS_FILE: Final = ".claude/settings.local.json"
MAX_FILE_BYTES: Final = 1024 * 1024
_OURS: Final = re.compile(r"\bhook wait\b.*--claude-pid")


class SetupError(ValueError):
    """The folder cannot be set up as asked; the message says why and what to do. Nothing was written."""


@dataclass(frozen=True, slots=True)
class SetupRequest:
    folder: Path
    agent: str
    mcp_url: str
    credential_file: Path
    relay: Sequence[str]
    """How to run ``relay`` from anywhere (absolute), e.g. ``["/home/u/relay/.venv/bin/relay"]``."""

    def helper_command(self) -> str:
        argv = [*self.relay, "hook", "headers", "--credential-file", str(self.credential_file)]
        return f"{shlex.join(argv)} --claude-pid $PPID"

    def waiter_command(self) -> str:
        argv = [*self.relay, "hook", "wait", "--credential-file", str(self.credential_file)]
        argv += ["--timeout", str(WAITER_TIMEOUT_S)]
        return f"{shlex.join(argv)} --claude-pid $PPID"


@dataclass
class SetupReport:
    request: SetupRequest
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Files this run created and added to the folder's ``.gitignore``."""
    tracked: list[str] = field(default_factory=list)
    """Files git tracks that this run changed."""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    master_key_form: bool = False
    """The folder's relay entries read relay's signing key (set up before per-agent credentials)."""

    def lines(self) -> list[str]:
        """What to tell the user: what was written, and what Claude Code still asks of them."""
        request, folder = self.request, self.request.folder
        lines = [f"relay: set up Claude Code in {folder} for agent {request.agent} at {request.mcp_url}"]
        for name in (MCP_FILE, SETTINGS_FILE):
            verb = "created" if name in self.created else "updated"
            what = (
                f'MCP server "{SERVER_NAME}" (type http); its headersHelper (`relay hook headers`) '
                "exchanges the folder's credential for fresh headers at each connection, so no token is "
                "stored in any file"
                if name == MCP_FILE
                else f"SessionStart and Stop hooks (`relay hook wait`, asyncRewake) wake an idle session "
                f'when mail arrives; "{SERVER_NAME}" approved for this folder (enabledMcpjsonServers)'
            )
            lines.append(f"  {verb} {name}: {what}")
        if self.master_key_form:
            lines.append(
                "  replaced the old form of relay's entries, which read relay's master signing key: this "
                "folder now holds only its own credential (sessions already running keep working until "
                "they reconnect)"
            )
        if self.ignored:
            lines.append(
                f"  .gitignore now ignores {', '.join(self.ignored)} (a credential, and files naming "
                "paths on this machine)"
            )
        lines += [
            f"  note: {name} is tracked by git; relay's entry names paths on this machine"
            for name in self.tracked
        ]
        lines += [f"  note: {text}" for text in self.notes]
        lines += [f"  warning: {text}" for text in self.warnings]
        lines += [
            "Claude Code still asks one thing of you, once for this folder: trust it. Run `claude` in",
            f'{folder} and choose "Yes, I trust this folder" (the dialog highlights "No, exit"',
            "because the folder declares a headersHelper). Until then Claude Code runs none of the above:",
            '`claude mcp list` shows relay as "⏸ Pending approval" (or says "headersHelper not run" when',
            "your user settings approve project servers). Nothing else needs approving: relay is approved",
            f"for this folder. Then `claude mcp list` in {folder} shows `{SERVER_NAME}: ... ✔ Connected`",
            f"while relay serves {request.mcp_url}. The agent becomes reachable when its Claude Code",
            "session starts there (it registers then, not now), and that session is woken when mail",
            "arrives.",
        ]
        return lines


def setup(request: SetupRequest) -> SetupReport:
    """Write (merge) both files; see the module docstring. Raises ``SetupError`` before writing anything
    when an existing file is not what Claude Code reads."""
    folder = request.folder
    if not folder.is_dir():
        raise SetupError(f"--dir {folder} is not a folder; create it first or pass another")
    mcp_path, settings_path = folder / MCP_FILE, folder / SETTINGS_FILE
    mcp, settings = _load(mcp_path), _load(settings_path)
    report = SetupReport(request)
    report.master_key_form = uses_master_key(mcp)
    _merge_mcp(mcp, request)
    _merge_settings(settings, request)
    for path, content in ((mcp_path, mcp), (settings_path, settings)):
        name = str(path.relative_to(folder))
        (report.updated if path.exists() else report.created).append(name)
        _write(path, content)
    _check_git(report)
    return report


def check(request: SetupRequest) -> None:
    """Raise ``SetupError`` when ``setup`` would refuse ``request`` (run before anything is issued or
    written: the merges are done and thrown away)."""
    folder = request.folder
    if not folder.is_dir():
        raise SetupError(f"--dir {folder} is not a folder; create it first or pass another")
    _merge_mcp(_load(folder / MCP_FILE), request)
    _merge_settings(_load(folder / SETTINGS_FILE), request)


def uses_master_key(mcp: dict[str, Any]) -> bool:
    """Whether an ``.mcp.json`` holds relay's entry of the old form (``--key-file``: the master key)."""
    servers = mcp.get("mcpServers")
    server = servers.get(SERVER_NAME) if isinstance(servers, dict) else None
    helper = server.get("headersHelper") if isinstance(server, dict) else None
    return isinstance(helper, str) and "--key-file" in helper


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_FILE_BYTES else None
    except (OSError, ValueError) as exc:
        raise SetupError(
            f"{path} cannot be read as JSON ({exc}); fix or move it, then run this again"
        ) from None
    if not isinstance(data, dict):
        raise SetupError(f"{path} is not a JSON object; fix or move it, then run this again")
    return data


def _object(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise SetupError(f"{path}: {key!r} is not a JSON object; fix it, then run this again")
    return value


def _merge_mcp(mcp: dict[str, Any], request: SetupRequest) -> None:
    servers = _object(mcp, "mcpServers", MCP_FILE)
    previous = servers.get(SERVER_NAME)
    entry = {"type": "http", "url": request.mcp_url, "headersHelper": request.helper_command()}
    if isinstance(previous, dict) and previous.get("headers") == variable_headers(empty_default=True):
        entry["headers"] = previous["headers"]  # `relay setup copilot`'s, for the Copilot CLI in this folder
    servers[SERVER_NAME] = entry


def _merge_settings(settings: dict[str, Any], request: SetupRequest) -> None:
    hooks = _object(settings, "hooks", SETTINGS_FILE)
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            raise SetupError(f"{SETTINGS_FILE}: hooks.{event} is not a list; fix it, then run this again")
        kept = []
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                group["hooks"] = [h for h in group["hooks"] if not _is_ours(h)]
                if not group["hooks"]:
                    continue
            kept.append(group)
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    entry = {
        "type": "command",
        "command": request.waiter_command(),
        "asyncRewake": True,
        "timeout": HOOK_TIMEOUT_S,
    }
    for event in HOOK_EVENTS:
        hooks.setdefault(event, []).append({"hooks": [dict(entry)]})
    enabled = settings.setdefault("enabledMcpjsonServers", [])
    if not isinstance(enabled, list):
        raise SetupError(
            f"{SETTINGS_FILE}: 'enabledMcpjsonServers' is not a list; fix it, then run this again"
        )
    if SERVER_NAME not in enabled:
        enabled.append(SERVER_NAME)


def _is_ours(hook: object) -> bool:
    return (
        isinstance(hook, dict)
        and hook.get("type") == "command"
        and isinstance(hook.get("command"), str)
        and _OURS.search(hook["command"]) is not None
    )


def _write(path: Path, content: dict[str, Any]) -> None:
    """Replace ``path`` atomically (same folder, same mode if it existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(content, indent=2) + "\n")
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("git") is None:
        return None
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _in_work_tree(folder: Path) -> bool:
    inside = _git(folder, "rev-parse", "--is-inside-work-tree")
    return inside is not None and inside.stdout.strip() == "true"


def _check_git(report: SetupReport) -> None:
    """Ignore the files this run created and the credential file (when git does not already), note
    tracked files it changed, and say so when the folder is not in a git work tree."""
    folder = report.request.folder
    if not _in_work_tree(folder):
        report.notes.append(
            f"{folder} is not in a git repository, so no .gitignore was written; "
            f"{report.request.credential_file.relative_to(folder)} holds this agent's credential: keep it "
            "out of anything you share"
        )
        return
    credential = str(report.request.credential_file.relative_to(folder))
    added = [
        n
        for n in [*report.created, credential]
        if (r := _git(folder, "check-ignore", "-q", "--", n)) and r.returncode == 1
    ]
    if added:
        _append_ignores(folder / ".gitignore", added)
        report.ignored += added
    for name in report.updated:
        listed = _git(folder, "ls-files", "--error-unmatch", "--", name)
        if listed is not None and listed.returncode == 0:
            report.tracked.append(name)


def _append_ignores(gitignore: Path, names: list[str]) -> None:
    existing = gitignore.read_text() if gitignore.exists() else ""
    lines = [
        "# relay setup claude-code: machine-local (the agent's credential, this machine's relay command)"
    ]
    lines += [f"/{name}" for name in names]
    separator = "" if not existing or existing.endswith("\n") else "\n"
    gitignore.write_text(existing + separator + "\n".join(lines) + "\n")
