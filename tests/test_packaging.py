"""Every import is declared: the product's in ``dependencies``, ``broker.testing``'s in the ``testing``
extra too, the test suite's in the ``dev`` extra too (pyproject.toml)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OWN = {"broker", "adapters", "relay", "tests", "bench"}
DISTRIBUTIONS = packages_distributions()


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
        (["tests"], ("dev",)),
    ],
    ids=["product", "broker.testing", "tests"],
)
def test_every_import_is_declared(paths: list[str], extras: tuple[str, ...]) -> None:
    files = [f for p in paths for f in sorted((ROOT / p).rglob("*.py")) if "_gen" not in f.parts]
    if not extras:  # broker.testing is the one product package that may use the testing extra
        files = [f for f in files if (ROOT / "broker" / "testing") not in f.parents]
    allowed = declared(*extras)
    missing = {}
    for module, where in imported(files).items():
        owners = {_normal(d) for d in DISTRIBUTIONS.get(module, [module])}
        if not owners & allowed:
            missing[module] = (where, sorted(owners))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
