"""An agent folder's credential file: what its helper and hooks hold instead of relay's signing key.

``<folder>/.relay/credential`` (mode 0600, its folder 0700, git-ignored) holds one JSON object::

    {"url": "http://127.0.0.1:8080/mcp/agent", "agent": "author", "credential": "cr_....<secret>"}

``load`` reads it (refusing a file others can read, or one that is not that object); ``exchange`` trades
the credential at ``POST <listener>/agent/token`` for the three agent headers of one session, valid a
few minutes (``broker.front.token_route``). Stdlib only, like the rest of ``relay hook``: Claude Code
runs the helper at every connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker.front.paths import MCP_PATH, TOKEN_PATH
from relay.claude_code import relay_http

FOLDER: Final = ".relay"
FILE_NAME: Final = "credential"
MAX_FILE_BYTES: Final = 4096
RENEW_BEFORE_S: Final = 60
"""An ``Exchanger`` trades again when its token has less than this left."""


class CredentialFileError(ValueError):
    """A credential file that cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True, slots=True)
class CredentialFile:
    url: str
    """The agent endpoint (``.../mcp/agent``) the credential is for."""
    agent: str
    credential: str

    @property
    def token_url(self) -> str:
        return self.url.removesuffix(MCP_PATH) + TOKEN_PATH

    def __repr__(self) -> str:  # never the secret, in a traceback or a log line
        return f"CredentialFile(url={self.url!r}, agent={self.agent!r}, credential=<redacted>)"


def path_in(folder: Path) -> Path:
    """Where ``relay setup claude-code`` writes the credential file of ``folder``."""
    return folder / FOLDER / FILE_NAME


def load(path: Path) -> CredentialFile:
    """The credential file at ``path``; ``CredentialFileError`` naming what is wrong."""
    again = "re-run `relay setup claude-code` in the agent's folder"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CredentialFileError(f"credential file {path} does not exist; {again}") from None
    except OSError as exc:
        raise CredentialFileError(f"credential file {path} cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CredentialFileError(f"credential file {path} is not a regular file; {again}")
        if info.st_mode & 0o077:
            raise CredentialFileError(
                f"credential file {path} is readable or writable by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}`"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw) if len(raw) <= MAX_FILE_BYTES else None
    except ValueError:
        data = None
    fields = ("url", "agent", "credential")
    if not isinstance(data, dict) or not all(isinstance(data.get(name), str) for name in fields):
        raise CredentialFileError(
            f"credential file {path} is not a JSON object with url, agent and credential; {again}"
        )
    if not data["url"].startswith(("http://", "https://")) or not data["url"].endswith(MCP_PATH):
        raise CredentialFileError(f"credential file {path}: url is not an http(s) URL ending in {MCP_PATH}")
    return CredentialFile(data["url"], data["agent"], data["credential"])


def write(path: Path, credential: CredentialFile) -> None:
    """Write ``credential`` at ``path`` (mode 0600, atomically; its folder created 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    content = {"url": credential.url, "agent": credential.agent, "credential": credential.credential}
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(json.dumps(content, indent=2) + "\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def exchange(
    credential: CredentialFile, session: str, timeout: float = 8.0, *, ttl: int | None = None
) -> dict[str, str]:
    """The three agent headers of ``session`` (a token of at most ``ttl`` seconds, when given), from
    relay in exchange for the credential (``relay_http.Refused`` with relay's cause, or
    ``relay_http.Unavailable``)."""
    answer = relay_http.exchange(
        credential.token_url, credential.credential, credential.agent, session, timeout, ttl=ttl
    )
    headers: dict[str, str] = answer["headers"]
    return headers


class Exchanger:
    """Headers for a long-running caller (the hook waiter): one exchange per session, again when the
    token has less than ``RENEW_BEFORE_S`` left. The file is read again at each exchange, so a
    re-run setup (a new credential) is picked up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cached: tuple[str, float, dict[str, str]] | None = None

    def __call__(self, session: str) -> dict[str, str]:
        now = time.monotonic()
        cached = self._cached
        if cached is not None and cached[0] == session and now < cached[1]:
            return cached[2]
        answer_started = time.monotonic()
        credential = load(self.path)
        answer = relay_http.exchange(credential.token_url, credential.credential, credential.agent, session)
        until = answer_started + max(0, int(answer["expires_in"]) - RENEW_BEFORE_S)
        headers: dict[str, str] = answer["headers"]
        self._cached = (session, until, headers)
        return headers
