"""The ``relay`` console script and ``python -m relay``.

``relay hook ...`` goes straight to its own light module: Claude Code runs it at every MCP connection
(with a 10 s limit for a ``headersHelper``) and at every turn, while ``relay.cli`` imports every
command, hence FastAPI, the MCP SDK, pydantic and redis-py (measured: 0.2-0.4 s for ``relay hook``
against 1-4 s for the full parser on this 2-core machine, the higher figures under load).

Output whose reader has gone (``relay read ... | head -1``) ends every command quietly, here, once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Final

EXIT_READER_GONE: Final = 141
"""What a shell reports for a command that SIGPIPE ended (128 + 13): ``relay`` exits with it, quietly,
when the reader of its output has gone."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _run(args)
        finally:  # also after --help's SystemExit: a reader that left shows here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        # Python ignores SIGPIPE, so writing to a closed pipe raises; point stdout at /dev/null so that
        # the flush at exit cannot raise again (https://docs.python.org/3/library/signal.html#note-on-sigpipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_READER_GONE


def _run(args: list[str]) -> int:
    if args[:1] == ["hook"]:
        from relay.commands import hook  # only this command: see the module docstring

        return hook.main(args[1:])
    from relay.cli import main as full_main

    return full_main(args)
