"""The ``relay`` subcommands. Each module has ``register(subparsers)``, which adds its parsers and sets
``handler`` (``Namespace -> int``) on each; ``relay.cli`` lists the modules. Handlers raise
``UsageError`` for bad invocations (exit 2); ``relay.cli.main`` turns the expected errors into one
``relay: error: ...`` line on stderr."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

Handler = Callable[[argparse.Namespace], int]

EXIT_RUNTIME = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command line is wrong (exit 2); the message says how to fix it."""


def bounded_int(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, in ``unit`` (e.g. "seconds") if
    given. A bad value is one usage line that names the range."""
    of_unit = f" of {unit}" if unit else ""
    in_unit = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{of_unit}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}{in_unit}")
        return value

    return parse
