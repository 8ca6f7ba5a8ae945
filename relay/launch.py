"""``relay run gemini|copilot [ARGS...]``: start a coding-agent CLI whose MCP headers come from its
environment.

Gemini CLI runs no headers helper, and the Copilot CLI ignores one; both expand ``${VAR}`` in their MCP
config from their own environment at each connection (``relay setup gemini|copilot`` writes
``${RELAY_...}`` there). The launcher reads the folder's
credential file, picks the relay session (``NAME-<pid>-<start>``: the PID stays the CLI's after
``exec``, so a restarted CLI is a new session that takes over the inbox), exchanges the credential for
the session's headers, registers the session (``RegisterAgentAddress``, so mail is kept for it before
the model calls anything), puts the headers in the environment and replaces itself with the CLI.

The token in the environment cannot be refreshed inside the running CLI: it lives as long as relay's
exchanged tokens (``broker.front.token_route.EXCHANGE_TTL_SECONDS``), which the launcher prints.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker.ids import check_session_id
from relay import credential_file
from relay.claude_code import relay_http
from relay.claude_code.session import ClaudeProcess
from relay.folder_setup import ENV_SESSION, HEADER_ENV

REGISTER_PROVIDER: Final = "claudecode"
"""The host-tier provider the launched session registers as (a local agent reached on this machine)."""


@dataclass(frozen=True, slots=True)
class Launchable:
    """A CLI ``relay run`` starts: its command and the variable each agent header goes in."""

    command: str
    header_env: Mapping[str, str]
    session_env: str


LAUNCHABLE: Final[dict[str, Launchable]] = {
    "gemini": Launchable("gemini", HEADER_ENV, ENV_SESSION),
    "copilot": Launchable("copilot", HEADER_ENV, ENV_SESSION),
}


class LaunchError(Exception):
    """The CLI cannot be started as asked; the message says why and what to do."""


def session_for(name: str, pid: int) -> str:
    """The relay session of the CLI that will run as process ``pid`` (this one, after ``exec``)."""
    return check_session_id(f"{name}-{pid}-{ClaudeProcess.of(pid).started}")


def environment(name: str, folder: Path, base: Mapping[str, str]) -> tuple[dict[str, str], float]:
    """``base`` plus the agent headers of a new session of ``name`` (the session registered); and the
    token's expiry (Unix seconds)."""
    launchable = LAUNCHABLE[name]
    path = credential_file.path_in(folder)
    credential = credential_file.load(path)
    session = session_for(name, os.getpid())
    answer = relay_http.exchange(credential.token_url, credential.credential, credential.agent, session)
    headers: dict[str, str] = answer["headers"]
    endpoint = f"unix:{folder / '.relay' / (session + '.sock')}"
    if len(endpoint) > 112:
        endpoint = f"unix:/tmp/{session}.sock"
    relay_http.register(credential.url, headers, endpoint)
    env = dict(base)
    lowered = {k.lower(): v for k, v in headers.items()}
    for header, variable in launchable.header_env.items():
        env[variable] = lowered[header.lower()]
    env[launchable.session_env] = session
    return env, time.time() + float(answer["expires_in"])


def run(name: str, args: Sequence[str], folder: Path, command: str | None = None) -> int:
    """Exchange, register and ``exec`` the CLI (returns only when it cannot start)."""
    launchable = LAUNCHABLE[name]
    program = command or shutil.which(launchable.command)
    if program is None:
        raise LaunchError(f"`{launchable.command}` is not on PATH; install it or pass --command PATH")
    try:
        env, expires = environment(name, folder, os.environ)
    except credential_file.CredentialFileError as exc:
        raise LaunchError(f"{exc} (run `relay setup {name}` in {folder} first)") from None
    except relay_http.Refused as exc:
        raise LaunchError(f"relay refused the folder's credential: {exc.message or exc}") from None
    except relay_http.Unavailable as exc:
        raise LaunchError(f"relay is not answering: {exc}; start relay serve, then run this again") from None
    left = max(0, round((expires - time.time()) / 60))
    print(
        f"relay: {name} runs as agent {env[launchable.header_env['X-CSF-Agent-ID']]}, session "
        f"{env[launchable.session_env]}; its relay token expires in {left} min, at "
        f"{time.strftime('%H:%M', time.localtime(expires))} ({name} cannot refresh it: start it again then)",
        file=sys.stderr,
        flush=True,
    )
    os.execve(program, [program, *args], env)  # noqa: S606 - the CLI's own argv, no shell between
    return 1  # not reached: execve replaces this process or raises
