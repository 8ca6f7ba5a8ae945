"""The ``relay hook`` commands of coding agents other than Claude Code (``relay setup codex | gemini``):

- ``codex``: the Codex ``SessionStart``/``SessionEnd`` hook; starts (stops) the detached waiter.
- ``codex-wait``: that waiter (``relay.codex.waiter``), which wakes an idle session with ``codex queue``.
- ``after-turn``: an end-of-turn hook (Gemini CLI's ``AfterAgent``, the Copilot CLI's ``agentStop``) for
  CLIs that cannot be woken while idle: it waits a short while for mail and, when there is some,
  answers with relay's summary the way the CLI turns into a next prompt (``--answer exit2``: exit 2 and
  the summary on stderr; ``--answer decision``: ``{"decision": "block", "reason": SUMMARY}`` on stdout).

Each reads the folder's credential file (``relay.credential_file``) and exchanges it for short-lived
agent headers; none holds the signing key. Like ``relay hook``, stdlib only: they run at every turn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Final

from broker.front.paths import MCP_PATH
from broker.ids import check_session_id
from relay import credential_file
from relay.claude_code import relay_http
from relay.claude_code.relay_http import WAIT_PATH
from relay.claude_code.summary import summary
from relay.claude_code.waiter import read_hook_input
from relay.codex import waiter as codex_waiter
from relay.commands import bounded_int

EXIT_QUIET: Final = 0
EXIT_ANNOUNCE: Final = 2
"""Gemini CLI: an ``AfterAgent`` hook's exit 2 makes its stderr the session's next prompt."""


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    codex = commands.add_parser(
        "codex",
        help="Codex's SessionStart/SessionEnd hook (relay setup codex): start or stop the waiter",
        description="Read Codex's hook JSON on stdin. SessionStart: start the detached waiter "
        "(`relay hook codex-wait`) for this Codex session and return at once. SessionEnd: ask it to go. "
        "Always exit 0, printing nothing Codex shows the model.",
    )
    wait = commands.add_parser(
        "codex-wait",
        help="the waiter a Codex SessionStart hook starts: `codex queue` when mail arrives",
        description="Register SESSION, then block on relay's mail-pending wait; for each batch of new mail "
        "run `codex queue --thread THREAD --message SUMMARY`. Ends when asked (a newer waiter, SessionEnd), "
        "when relay refuses, or when `codex queue` fails.",
    )
    stream = commands.add_parser(
        "wake-stream",
        help="the waiter opencode's relay plugin runs: one JSON line per batch of new mail",
        description="Register SESSION, then block on relay's mail-pending wait; for each batch of new mail "
        'print {"summary": TEXT} as one line on stdout (the plugin hands it to the idle session with '
        "promptAsync). Ends when its parent (opencode) is gone, stdout is closed, or relay refuses.",
    )
    after = commands.add_parser(
        "after-turn",
        help="an end-of-turn hook (Gemini CLI AfterAgent): announce mail that arrived",
        description="Wait up to --timeout seconds for mail the agent was not told about; with some, print "
        "relay's summary on stderr and exit 2 (Gemini CLI makes it the next prompt); else exit 0, silent.",
    )
    for parser in (codex, wait, after, stream):
        parser.add_argument(
            "--credential-file", type=Path, required=True, metavar="PATH", help="the folder's credential file"
        )
    for parser in (codex, wait, stream):
        parser.add_argument("--session", required=True, metavar="ID", help="the relay session")
    for parser in (codex, wait):
        parser.add_argument(
            "--codex", default="codex", metavar="CMD", help="the codex command (default codex)"
        )
    wait.add_argument(
        "--thread", required=True, metavar="ID", help="Codex's session id (codex queue --thread)"
    )
    for parser in (codex, wait):
        parser.add_argument(
            "--watch-pid",
            type=bounded_int(2, 2**22),
            metavar="PID",
            help="end the waiter when this process ends ($PPID in the hook's command line)",
        )
    after.add_argument(
        "--session-env",
        required=True,
        metavar="VAR",
        help="the environment variable holding the relay session (set by `relay run`)",
    )
    after.add_argument(
        "--timeout",
        type=bounded_int(0, 3600, "seconds"),
        default=2,
        metavar="SECONDS",
        help="how long to wait for mail at the end of a turn (default 2)",
    )
    after.add_argument(
        "--answer",
        choices=("exit2", "decision"),
        default="exit2",
        help="how to hand the CLI the summary: exit 2 with it on stderr (Gemini CLI, the default) or a "
        '{"decision": "block", "reason": ...} line on stdout (Copilot CLI)',
    )
    codex.set_defaults(handler=_codex)
    stream.set_defaults(handler=_wake_stream)
    wait.set_defaults(handler=_codex_wait)
    after.set_defaults(handler=_after_turn)


def _quiet(why: str) -> int:
    print(f"relay hook: {why}", file=sys.stderr)
    return EXIT_QUIET


def _codex(args: argparse.Namespace) -> int:
    hook_input = read_hook_input(sys.stdin)
    try:
        session = check_session_id(args.session, "--session")
        agent = credential_file.load(args.credential_file).agent
    except (ValueError, credential_file.CredentialFileError) as exc:
        return _quiet(str(exc))
    event = hook_input.get("hook_event_name")
    if event == "SessionEnd":
        codex_waiter.stop(agent, session)
        return EXIT_QUIET
    thread = codex_waiter.thread_id(hook_input)
    if thread is None:
        return _quiet("the hook's input has no session_id")
    argv = [*codex_waiter.relay_argv(), "hook", "codex-wait", "--credential-file", str(args.credential_file)]
    argv += ["--session", session, "--thread", thread, "--codex", args.codex]
    if args.watch_pid is not None:
        argv += ["--watch-pid", str(args.watch_pid)]
    try:
        codex_waiter.start_detached(argv, codex_waiter.log_path(agent, session))
    except OSError as exc:
        return _quiet(f"the waiter did not start: {exc}")
    return EXIT_QUIET


def _codex_wait(args: argparse.Namespace) -> int:
    try:
        session = check_session_id(args.session, "--session")
        credential = credential_file.load(args.credential_file)
    except (ValueError, credential_file.CredentialFileError) as exc:
        return _quiet(str(exc))
    options = codex_waiter.CodexWait(
        agent=credential.agent,
        mcp_url=credential.url,
        wait_url=credential.url.removesuffix(MCP_PATH) + WAIT_PATH,
        session=session,
        thread=args.thread,
        codex=args.codex,
        headers=credential_file.Exchanger(args.credential_file),
        watch=args.watch_pid,
    )
    return codex_waiter.run(options, sys.stderr)


def _wake_stream(args: argparse.Namespace) -> int:
    try:
        session = check_session_id(args.session, "--session")
        credential = credential_file.load(args.credential_file)
    except (ValueError, credential_file.CredentialFileError) as exc:
        return _quiet(str(exc))
    options = codex_waiter.CodexWait(
        agent=credential.agent,
        mcp_url=credential.url,
        wait_url=credential.url.removesuffix(MCP_PATH) + WAIT_PATH,
        session=session,
        thread="",
        codex="",
        headers=credential_file.Exchanger(args.credential_file),
        watch=os.getppid(),  # opencode, which started it
        wake=codex_waiter.wake_line,
    )
    return codex_waiter.run(options, sys.stderr)


def _after_turn(args: argparse.Namespace) -> int:
    read_hook_input(sys.stdin)
    try:
        session = check_session_id(os.environ.get(args.session_env, ""), f"${args.session_env}")
        credential = credential_file.load(args.credential_file)
        headers = credential_file.exchange(credential, session)
        pending = relay_http.wait(
            credential.url.removesuffix(MCP_PATH) + WAIT_PATH, headers, args.timeout * 1000
        )
    except (relay_http.Refused, relay_http.Unavailable) as exc:
        return _quiet(str(exc))
    except (ValueError, credential_file.CredentialFileError) as exc:
        return _quiet(str(exc))
    if pending.count == 0:
        print(json.dumps({}))  # both CLIs read a hook's stdout as JSON: an empty object changes nothing
        return EXIT_QUIET
    text = summary(credential.agent, pending.answer)
    if args.answer == "decision":
        print(json.dumps({"decision": "block", "reason": text}), flush=True)
        return EXIT_QUIET
    print(text, file=sys.stderr, flush=True)
    return EXIT_ANNOUNCE
