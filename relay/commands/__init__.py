"""The ``relay`` subcommands. Each module has ``register(subparsers)``, which adds its parsers and sets
``handler`` (``Namespace -> int``) on each; ``relay.cli`` lists the modules. Handlers raise
``UsageError`` for bad invocations (exit 2); ``relay.cli.main`` turns the expected errors into one
``relay: error: ...`` line on stderr."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from broker.text import shown

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

Handler = Callable[[argparse.Namespace], int]

EXIT_RUNTIME = 1
EXIT_USAGE = 2


_OWNER = "_parser_with_extras"
"""Namespace attribute: the innermost (sub)parser that was given arguments it does not take."""


class UsageError(Exception):
    """The command line is wrong (exit 2); the message says how to fix it."""


class Parser(argparse.ArgumentParser):
    """The parser of ``relay`` and of each (sub)command: a usage error is one line that names what is
    wrong (an option the command does not take, with the closest one it does) and the help of the
    command it was given to; exit ``usage_exit``."""

    usage_exit = EXIT_USAGE

    def error(self, message: str) -> NoReturn:
        self.exit(self.usage_exit, f"relay: error: {message}; see `{self.prog} --help`\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(parsed, _OWNER):  # a subcommand's parser returns first: it owns them
            setattr(parsed, _OWNER, self)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        owner: Any = vars(parsed).pop(_OWNER, self)
        if extras:
            owner.error(owner.not_taken(extras))
        return parsed

    def not_taken(self, extras: Sequence[str]) -> str:
        """What to say of arguments this command does not take."""
        first = extras[0]
        if first.startswith("-") and first != "-":
            name = first.split("=", 1)[0]
            options = sorted(o for o in self._option_string_actions if o.startswith("--"))
            close = difflib.get_close_matches(name, options, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"`{self.prog}` has no option {shown(name)}{hint}"
        return f"`{self.prog}` takes no further argument '{shown(first)}'"


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
