"""The one escaping rule for text relay did not produce (agent input, or whatever a store holds) on its
way to a human: terminal output, error messages and log lines.

Characters that are not printable (controls such as newline and ESC, line and paragraph separators,
format characters such as bidi overrides) become Python escapes (``\\n``, ``\\x1b``, ``\\u202e``), and a
backslash is doubled, so escaped text can neither forge a line or a table row, nor drive the terminal,
nor pass off an escape as one of relay's own. ``counted`` is the one way a count and its noun are
written ("1 agent", "2 agents").
"""

from __future__ import annotations

SHOWN_CHARS = 64
"""Characters of client text an error message or log line quotes at most."""


def escaped(text: str) -> str:
    """``text`` with every non-printable character and every backslash escaped (printable text,
    non-ASCII included, is kept as is)."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in text
    )


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut) and escaped."""
    cut = text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"
    return escaped(cut)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 agent``, ``0 agents``, ``2 agents``: ``count`` and ``noun``, in the plural (``plural``, else
    ``noun`` + s) unless ``count`` is 1."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def encodable(text: str) -> bool:
    """True when ``text`` has a UTF-8 spelling (no lone surrogate, which JSON's ``\\ud800`` can hold)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def failure(exc: BaseException) -> str:
    """How a log line names an unexpected failure: its type and message on one escaped line of at most
    300 characters. Never its traceback: one line per failure, nothing a client's text can forge."""
    return shown(f"{type(exc).__name__}: {exc}", 300)
