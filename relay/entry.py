"""The ``relay`` console script and ``python -m relay``.

``relay hook ...`` goes straight to its own light module: Claude Code runs it at every MCP connection
(with a 10 s limit for a ``headersHelper``) and at every turn, while ``relay.cli`` imports every
command, hence FastAPI, the MCP SDK, pydantic and redis-py (measured: 0.2-0.4 s for ``relay hook``
against 1-4 s for the full parser on this 2-core machine, the higher figures under load).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["hook"]:
        from relay.commands import hook  # only this command: see the module docstring

        return hook.main(args[1:])
    from relay.cli import main as full_main

    return full_main(args)
