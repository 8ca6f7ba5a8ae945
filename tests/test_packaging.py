"""Every import is declared: the product's in ``dependencies``, ``broker.testing``'s in the ``testing``
extra too, each Workbench runtime's in its own extra (``copilot``, ``claude-agent``), the test suite's
in the ``dev`` extra too (pyproject.toml); and relay imports and runs without the optional SDKs."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OWN = {"broker", "adapters", "relay", "tests", "bench"}
DISTRIBUTIONS = packages_distributions()
RUNTIMES = {
    "adapters/workbench/copilot.py": ("copilot", {"copilot": "github-copilot-sdk"}),
    "adapters/workbench/claude_agent.py": ("claude-agent", {"claude_agent_sdk": "claude-agent-sdk"}),
}
"""An optional extra's adapter -> (its extra, the modules it brings: known without it installed)"""


def declared(*extras: str) -> set[str]:
    """Normalised names of the runtime dependencies plus those of ``extras`` (following self-references)."""
    names: set[str] = set()
    todo = [
        *PROJECT["dependencies"],
        *(r for extra in extras for r in PROJECT["optional-dependencies"][extra]),
    ]
    while todo:
        requirement = todo.pop()
        name = _normal(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])
        inner = re.search(r"\[(.*?)\]", requirement)
        wanted = [extra.strip() for extra in inner.group(1).split(",")] if inner else []
        if name == _normal(PROJECT["name"]):
            todo += [r for extra in wanted for r in PROJECT["optional-dependencies"][extra]]
            continue
        names.add(name)
        names.update(_normal(extra) for extra in wanted)  # redis[hiredis] brings hiredis
    return names


def imported(paths: list[Path]) -> dict[str, str]:
    """Top-level third-party modules imported by ``paths``: module -> the first file importing it."""
    found: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "importlib.import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                modules = [str(node.args[0].value)]
            for module in modules:
                top = module.split(".")[0]
                if top not in OWN and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize(
    ("paths", "extras"),
    [
        (["broker", "adapters", "relay"], ()),
        (["broker/testing"], ("testing",)),
        *(([path], (extra,)) for path, (extra, _) in RUNTIMES.items()),
        (["tests"], ("dev",)),
    ],
    ids=["product", "broker.testing", "copilot", "claude-agent", "tests"],
)
def test_every_import_is_declared(paths: list[str], extras: tuple[str, ...]) -> None:
    files = [f for p in paths for f in sorted((ROOT / p).rglob("*.py")) if "_gen" not in f.parts]
    if not extras:  # broker.testing and the runtime adapters may use their extras
        files = [f for f in files if (ROOT / "broker" / "testing") not in f.parents]
        files = [f for f in files if str(f.relative_to(ROOT)) not in RUNTIMES]
    known = {m: d for _, modules in RUNTIMES.values() for m, d in modules.items()}
    allowed = declared(*extras)
    missing = {}
    for module, where in imported(files).items():
        owners = {_normal(d) for d in DISTRIBUTIONS.get(module, [known.get(module, module)])}
        if not owners & allowed:
            missing[module] = (where, sorted(owners))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


WITHOUT_SDKS = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("copilot", "claude_agent_sdk"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Absent())
import importlib.util
SDKS = ("copilot", "claude_agent_sdk")
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in SDKS else ORIGINAL(name, *a)
"""


def test_relay_imports_and_refuses_a_runtime_whose_sdk_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "workbench.toml"
    config.write_text('[[agent]]\nid = "planner"\nruntime = "copilot"\nmodel = "gpt-4.1"\ndir = "w"\n')
    code = (
        "import importlib.util; ORIGINAL = importlib.util.find_spec\n"
        + WITHOUT_SDKS
        + "import relay.cli, relay.workbench, adapters.workbench, broker.front.app\n"
        + f"raise SystemExit(relay.cli.main(['workbench', '--config', {str(config)!r}, '--redis-url', "
        + "'redis://127.0.0.1:9/0']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "agent[0] (planner).runtime: 'copilot' needs its SDK, which is not installed" in done.stderr
    assert "pip install 'relay[copilot]'" in done.stderr and "Traceback" not in done.stderr
