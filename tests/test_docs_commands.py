"""What the README and docs/ tell a first-time reader to type works as written: every command in their
code blocks is ``.venv/bin/relay ...`` (the README's first command puts ``relay`` there, not on
``PATH``); the README's tool list is numbered in order and links the reliability figures; docs/shell.md
names every option of the shell commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay.cli import build_parser
from relay.settings import ShellSettings, option

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]
BARE = re.compile(r"(?:^|[|;&]\s*|\$\(\s*)relay\s")
"""``relay`` where a shell would look it up on PATH: a line's start, or after a pipe, ``;``, ``&&``."""


def code_lines(path: Path) -> list[str]:
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", path.read_text(), re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines()]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_in_a_code_block_is_the_venvs(path: Path) -> None:
    bare = [line for line in code_lines(path) if BARE.search(line)]
    assert not bare, f"{path.name}: `relay` is .venv/bin/relay after the README's first command: {bare}"


def test_the_readmes_tool_list_is_numbered_in_order_and_links_the_reliability_figures() -> None:
    readme = (ROOT / "README.md").read_text()
    tools = readme.split("The tools, as a model calls them:")[1].split("\nSuccessful results")[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. ", tools, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 7, numbers
    assert "(docs/reliability.md)" in readme


def test_docs_shell_names_every_option_of_the_shell_commands() -> None:
    shell = (ROOT / "docs" / "shell.md").read_text()
    settings = {option(name) for name in ShellSettings.model_fields}
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("agents", "send", "read", "tail", "thread"):
        for action in commands[name]._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag not in settings and flag != "--help":
                    assert f"{flag}" in shell.split("## Sending as a person")[0], f"relay {name} {flag}"
