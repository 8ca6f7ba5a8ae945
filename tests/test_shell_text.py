"""How the shell commands show things: times relative and absolute, aligned tables, the kinds."""

from __future__ import annotations

from relay.shell import brief, duration, table


def test_times_are_relative_and_absolute() -> None:
    now = 1_764_630_000_000  # 2025-12-01T23:00:00Z
    assert duration(4.9) == "4s" and duration(200) == "3m 20s" and duration(7300) == "2h 1m"
    assert duration(3 * 86400 + 4 * 3600) == "3d 4h"
    assert brief(now - 200_000, now) == "3m 20s ago 22:56:40Z"
    assert brief(now - 2 * 86400_000, now) == "2d 0h ago 2025-11-29T23:00Z"
    assert brief(None, now) == "-"


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    text = table(("AGENT", "INBOX"), [("a", "5"), ("longer", "120")])
    assert text.splitlines() == ["AGENT   INBOX", "a           5", "longer    120"]


def test_the_kinds_relay_send_names_are_the_contracts() -> None:
    from broker.agent_message import KIND_LABELS
    from relay.cli import build_parser

    usage = build_parser().parse_args(["send", "--from", "a", "--to", "b", "x"])
    assert usage.kind is None
    assert f"--kind {'|'.join(KIND_LABELS.values())}" in " ".join(_help("send").split())


def _help(command: str) -> str:
    import contextlib
    import io

    from relay.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args([command, "--help"])
    return out.getvalue()
