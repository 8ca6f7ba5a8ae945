"""``relay workbench --config workbench.toml``: host agent SDK sessions as in-process agents."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from relay.settings import SettingsError, StoreSettings, add_options, load, store_url

if TYPE_CHECKING:
    from relay.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "workbench",
        help="host the agent SDK sessions of a workbench.toml as in-process agents",
        description="Run the sessions configured in a workbench.toml (GitHub Copilot SDK or Claude Agent "
        "SDK, each in its own CLI process) as relay agents on the store relay serve uses: messages to "
        "them become prompts in their sessions, and their models send with relay's tools. The config is "
        "checked whole first; a field relay cannot honour is named. See docs/workbench.md.",
    )
    parser.add_argument("--config", required=True, type=Path, metavar="FILE", help="the workbench.toml")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="lowest level logged",
    )
    parser.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="log lines as text or JSON"
    )
    add_options(parser, StoreSettings)
    parser.set_defaults(handler=_workbench)


def _workbench(args: argparse.Namespace) -> int:
    from relay import logs
    from relay.workbench import SessionStartError, run
    from relay.workbench_config import WorkbenchConfigError
    from relay.workbench_config import load as load_config

    settings = load(StoreSettings, args)
    try:
        loaded = load_config(args.config)
    except WorkbenchConfigError as exc:
        raise SettingsError(str(exc)) from None
    url = store_url(settings, "workbench")
    logs.configure(args.log_format, args.log_level)
    try:
        return run(loaded, url, settings.data_dir)
    except SessionStartError as exc:
        raise SettingsError(str(exc)) from None
