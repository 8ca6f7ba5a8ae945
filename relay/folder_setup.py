"""The steps every ``relay setup CLIENT`` shares: read a client's config file (refusing one that is not
what the client reads, before anything is written), merge relay's entries into it, write it atomically,
and add what a run created to the folder's ``.gitignore``.

Each client's own setup (``relay.codex.setup``, ``relay.gemini.setup``, ...) decides which entries are
relay's; everything else in the user's files is kept as it was. A run first loads and merges every
file in memory, and writes only when all of them merged: a refusal (``SetupError``) changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

MAX_FILE_BYTES: Final = 1024 * 1024
SERVER_NAME: Final = "relay"
"""The name of relay's MCP server entry in every client's config."""


ENV_AUTHORIZATION: Final = "RELAY_AUTHORIZATION"
ENV_AGENT: Final = "RELAY_AGENT_ID"
ENV_SESSION: Final = "RELAY_SESSION_ID"
HEADER_ENV: Final = {
    "Authorization": ENV_AUTHORIZATION,
    "X-CSF-Agent-ID": ENV_AGENT,
    "X-CSF-Session-ID": ENV_SESSION,
}
"""Each agent header and the variable ``relay run CLI`` puts it in, for CLIs that expand ``${VAR}``."""


def variable_headers(empty_default: bool = False) -> dict[str, str]:
    """The agent headers as ``${VAR}`` references (``${VAR:-}`` with ``empty_default``: an unset variable
    is then no error, which Claude Code needs when it reads the same entry)."""
    suffix = ":-" if empty_default else ""
    return {header: f"${{{variable}{suffix}}}" for header, variable in HEADER_ENV.items()}


class SetupError(ValueError):
    """The folder cannot be set up as asked; the message says why and what to do. Nothing was written."""


def _read(path: Path) -> bytes | None:
    if not path.exists():
        return None
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SetupError(
            f"{path} cannot be read ({exc.strerror}); fix or move it, then run this again"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SetupError(f"{path} is larger than {MAX_FILE_BYTES} bytes; fix or move it, then run this again")
    return raw


def load_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (``{}`` when there is no file); ``SetupError`` when it is not one."""
    raw = _read(path)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SetupError(f"{path} is not valid JSON ({exc}); fix or move it, then run this again") from None
    if not isinstance(data, dict):
        raise SetupError(f"{path} is not a JSON object; fix or move it, then run this again")
    return data


def json_object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``parent[key]``, created empty when missing; ``SetupError`` when it is there and not an object."""
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise SetupError(f"{where}: {key!r} is not a JSON object; fix it, then run this again")
    return value


def json_list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    """``parent[key]``, created empty when missing; ``SetupError`` when it is there and not a list."""
    value = parent.setdefault(key, [])
    if not isinstance(value, list):
        raise SetupError(f"{where}: {key!r} is not a list; fix it, then run this again")
    return value


def drop_hooks(groups: list[Any], ours: re.Pattern[str], where: str) -> list[Any]:
    """The hook groups of one event (``[{"matcher"?, "hooks": [{"type": "command", "command"}]}]``, the
    shape Claude Code, Codex and Gemini CLI share) without relay's own commands (``ours`` matches them);
    a group left empty goes too."""
    kept = []
    for group in groups:
        if isinstance(group, dict) and isinstance(group.get("hooks"), list):
            group["hooks"] = [
                hook
                for hook in group["hooks"]
                if not (
                    isinstance(hook, dict)
                    and isinstance(hook.get("command"), str)
                    and ours.search(hook["command"])
                )
            ]
            if not group["hooks"]:
                continue
        elif not isinstance(group, dict):
            raise SetupError(f"{where}: a hook group is not a JSON object; fix it, then run this again")
        kept.append(group)
    return kept


def merge_hooks(
    hooks: dict[str, Any], events: Iterable[str], entry: dict[str, Any], ours: re.Pattern[str], where: str
) -> None:
    """Replace relay's hook commands (``ours``) in every event of ``hooks`` by one group holding
    ``entry`` in each of ``events``; the user's own hooks stay where they are."""
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            raise SetupError(f"{where}: hooks.{event} is not a list; fix it, then run this again")
        kept = drop_hooks(groups, ours, where)
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    for event in events:
        hooks.setdefault(event, []).append({"hooks": [dict(entry)]})


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (JSON's escapes are TOML's for these characters)."""
    return json.dumps(value, ensure_ascii=False)


_HEADER: Final = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def merge_toml_table(path: Path, table: tuple[str, ...], body: dict[str, str]) -> str:
    """The text of the TOML file ``path`` with its table ``[a.b]`` (``table``) replaced by one holding
    ``body`` (string values), everything else kept byte for byte. ``SetupError`` when the file is not
    valid TOML, or defines the table some other way (inline or by dotted keys) that a text edit cannot
    replace safely."""
    raw = _read(path)
    text = "" if raw is None else raw.decode("utf-8", "replace")
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SetupError(f"{path} is not valid TOML ({exc}); fix or move it, then run this again") from None
    name = ".".join(table)
    kept: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        header = _HEADER.match(line)
        if header:
            parts = [p.strip().strip('"') for p in header.group(1).split(".")]
            skipping = tuple(parts[: len(table)]) == table
        if not skipping:
            kept.append(line)
    merged = "".join(kept)
    if merged and not merged.endswith("\n"):
        merged += "\n"
    block = f"[{name}]\n" + "".join(f"{key} = {toml_string(value)}\n" for key, value in body.items())
    merged += ("\n" if merged.strip() else "") + block
    try:
        parsed = tomllib.loads(merged)
    except tomllib.TOMLDecodeError:
        parsed = None
    found: Any = parsed
    for key in table:
        found = found.get(key) if isinstance(found, dict) else None
    if found != body:
        raise SetupError(
            f"{path} defines [{name}] in a form relay does not edit (an inline table or dotted keys); "
            f"move it into a [{name}] table of its own (or remove it), then run this again"
        )
    return merged


def write_file(path: Path, content: str, mode: int = 0o644) -> None:
    """Replace ``path`` atomically (same folder; the mode it had, else ``mode``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else mode
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def json_text(content: dict[str, Any]) -> str:
    return json.dumps(content, indent=2) + "\n"


@dataclass
class Written:
    """What one setup run wrote: files created and updated, those it added to ``.gitignore``, and
    tracked files it changed (all relative to the folder)."""

    folder: Path
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    tracked: list[str] = field(default_factory=list)

    def verb(self, name: str) -> str:
        return "created" if name in self.created else "updated"

    def lines(self) -> list[str]:
        lines = []
        if self.ignored:
            lines.append(
                f"  .gitignore now ignores {', '.join(self.ignored)} (they name files on this machine)"
            )
        lines += [
            f"  note: {name} is tracked by git; relay's entry names paths on this machine"
            for name in self.tracked
        ]
        return lines


def write_all(folder: Path, files: dict[str, str], client: str, created: Iterable[str] = ()) -> Written:
    """Write every file (name relative to ``folder`` → content), then ignore the new ones in git, and
    also those the caller ``created`` itself (the credential file)."""
    written = Written(folder, created=list(created))
    for name, content in files.items():
        path = folder / name
        (written.updated if path.exists() else written.created).append(name)
        write_file(path, content)
    check_git(written, client)
    return written


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("git") is None:
        return None
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def check_git(written: Written, client: str) -> None:
    """Add the files this run created to ``.gitignore`` (when git does not ignore them already), and note
    tracked files it changed."""
    folder = written.folder
    inside = _git(folder, "rev-parse", "--is-inside-work-tree")
    if inside is None or inside.stdout.strip() != "true":
        return
    added = [
        n for n in written.created if (r := _git(folder, "check-ignore", "-q", "--", n)) and r.returncode == 1
    ]
    if added:
        gitignore = folder / ".gitignore"
        existing = gitignore.read_text() if gitignore.exists() else ""
        lines = [f"# relay setup {client}: machine-local (this machine's relay command and paths)"]
        lines += [f"/{name}" for name in added]
        separator = "" if not existing or existing.endswith("\n") else "\n"
        gitignore.write_text(existing + separator + "\n".join(lines) + "\n")
        written.ignored += added
    for name in written.updated:
        listed = _git(folder, "ls-files", "--error-unmatch", "--", name)
        if listed is not None and listed.returncode == 0:
            written.tracked.append(name)


def check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise SetupError(f"--dir {folder} is not a folder; create it first or pass another")


CREDENTIAL_FILE: Final = ".relay/credential"
"""Where a set-up folder keeps its agent's credential (``relay.credential_file``), relative to it."""


@dataclass(frozen=True, slots=True)
class FolderRequest:
    """One ``relay setup CLIENT`` run: the folder, its agent and relay's endpoint, and how to run
    ``relay`` from anywhere (absolute), e.g. ``["/home/u/relay/.venv/bin/relay"]``."""

    folder: Path
    agent: str
    mcp_url: str
    relay: tuple[str, ...]

    @property
    def credential_file(self) -> Path:
        return self.folder / CREDENTIAL_FILE

    def relay_argv(self, *args: str) -> list[str]:
        """``relay ARGS`` as an argument vector that runs from any folder."""
        return [*self.relay, *args]
