"""The core never imports a storage technology: ``broker`` (but for its command-line wiring) works
without ``redis``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CORE_MODULES = [
    "broker.relay",
    "broker.ports",
    "broker.envelope",
    "broker.ids",
    "broker.addresses",
    "broker.contract",
    "broker.agent_message",
    "broker.errors",
    "broker.metrics",
    "broker.testing.conformance",
    "broker.front.app",
    "broker.front.tools",
    "broker.front.auth",
    "broker.front.tokens",
    "broker.front.key_file",
    "broker.cli",
    "adapters.memory",
    "adapters.providers",
]


def test_the_core_does_not_import_redis() -> None:
    imports = "; ".join(f"import {m}" for m in CORE_MODULES)
    found = "sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.'))"
    code = f"import sys; {imports}; print({found})"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_no_core_source_mentions_redis_imports() -> None:
    for path in (ROOT / "broker").rglob("*.py"):
        if "_gen" in path.parts or path.name == "serve.py" or path.name.startswith("cli_"):
            continue
        text = path.read_text()
        assert "import redis" not in text and "from redis" not in text, path
