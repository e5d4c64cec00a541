"""Every child of inferd.supervisor (module or package) is named in one layer of the import contract
(pyproject.toml [tool.importlinter]), so that `lint-imports` checks the direction of every import: a new
top-level module must be given its floor. lint-imports itself checks the directions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def _supervisor_children() -> set[str]:
    folder = ROOT / "supervisor"
    modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    if (folder / "_gen").is_dir():  # generated at build time (protos/generate.py), not always present
        packages.add("_gen")
    return modules | packages


def _layered() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = [c for c in config["tool"]["importlinter"]["contracts"]
                 if c["type"] == "layers" and c.get("containers") == ["inferd.supervisor"]]
    assert len(contracts) == 1, "expected one layers contract over inferd.supervisor"
    return {name.strip("() ") for layer in contracts[0]["layers"] for name in re.split(r"[|:]", layer)}


def test_every_supervisor_child_is_in_a_layer() -> None:
    missing = sorted(_supervisor_children() - _layered())
    assert not missing, f"supervisor children in no layer of the import contract (pyproject.toml): {missing}"


def test_every_layer_name_exists() -> None:
    stale = sorted(_layered() - _supervisor_children() - {"_gen"})
    assert not stale, f"layers naming no supervisor module or package: {stale}"
