"""The preview of text another agent wrote, as a mail-pending notice shows it: one printable line.

Stdlib only (``relay hook`` imports it and must start fast). Backslashes are doubled and every
non-printable character (control, format, line and paragraph separators) becomes ``\\uXXXX`` (or
``\\UXXXXXXXX``), so a preview can never forge lines of whatever quotes it; at most ``limit``
characters are kept, then ``…``.
"""

from __future__ import annotations

from typing import Final

PREVIEW_CHARS: Final = 120
"""Characters of a preview at most, before its ``…``."""


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` escaped into one printable line and cut to ``limit`` characters (plus ``…`` when cut)."""
    out: list[str] = []
    size = 0
    for char in text:
        if char == "\\":
            shown = "\\\\"
        elif char.isprintable():
            shown = char
        else:
            shown = f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"
        if size + len(shown) > limit:
            return "".join(out) + "…"
        out.append(shown)
        size += len(shown)
    return "".join(out)
