"""The benchmark runs in the venv the README and docs/performance.md set up: ``python3 -m venv .venv``,
``.venv/bin/pip install -q -e .`` and the extras docs/performance.md names (``.[bench]``), nothing from
the test suite's ``dev`` extra.

The venv is a real one (``python -m venv``), and holds exactly the distributions that install brings:
the closure of relay's requirements with those extras, read from the installed distributions' metadata
and linked from this interpreter's site-packages (pip would fetch the same ones from an index; linking
keeps the test offline and fast), with the checkout on its path as ``pip install -e .`` puts it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
INSTALL = re.compile(r"\.venv/bin/pip install -q -e '\.\[([a-z,]+)\]'")


def documented_extras() -> list[str]:
    """The extras docs/performance.md tells the reader to install for the benchmark."""
    found = INSTALL.search((ROOT / "docs" / "performance.md").read_text())
    return found.group(1).split(",") if found else []


def closure(extras: list[str]) -> dict[str, Distribution]:
    """Every installed distribution ``pip install -e '.[EXTRAS]'`` brings, by normalised name."""
    todo = [(r, frozenset(extras)) for r in PROJECT["dependencies"]]
    todo += [(r, frozenset()) for extra in extras for r in PROJECT["optional-dependencies"][extra]]
    found: dict[str, Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        text, asked = todo.pop()
        requirement = Requirement(text)
        environments = [{"extra": extra} for extra in asked] or [{"extra": ""}]
        if requirement.marker is not None and not any(requirement.marker.evaluate(e) for e in environments):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name == PROJECT["name"]:  # relay[testing]-style self-references
            extras_of = PROJECT["optional-dependencies"]
            todo += [(r, frozenset()) for x in requirement.extras for r in extras_of[x]]
            continue
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        if name not in found:
            try:
                found[name] = distribution(name)
            except PackageNotFoundError:  # not for this platform, or not installed here either
                continue
        todo += [(r, frozenset(requirement.extras)) for r in found[name].requires or []]
    return found


def make_venv(where: Path, distributions: dict[str, Distribution]) -> Path:
    """A venv at ``where`` holding ``distributions`` and the checkout; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
    )  # fmt: skip
    here = Path(sysconfig.get_path("purelib"))
    for dist in distributions.values():
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(str(dist.locate_file(top)))
            if top in ("..", "__pycache__") or source.parent != here or not source.exists():
                continue
            if not (site / top).exists():
                (site / top).symlink_to(source)
    (site / "relay-checkout.pth").write_text(f"{ROOT}\n")
    return python


def test_the_benchmark_imports_in_the_venv_the_docs_set_up(tmp_path: Path) -> None:
    extras = documented_extras()
    assert extras, "docs/performance.md names no `.venv/bin/pip install -q -e '.[EXTRA]'` for the bench"
    python = make_venv(tmp_path / "venv", closure(extras))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    modules = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
    script = f"import sys; sys.path.insert(0, 'bench'); [__import__(m) for m in {modules!r}]"
    imported = subprocess.run(
        [python, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    dev_only = subprocess.run(
        [python, "-c", "import hypothesis"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert dev_only.returncode != 0  # the venv holds no more than the docs' install would
