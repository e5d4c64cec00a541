"""Every child of inferd.supervisor (module or package) is named in one layer of the import contract
(pyproject.toml [tool.importlinter]), so that `lint-imports` checks the direction of every import: a new
top-level module must be given its floor. The forbidden contracts of infer-ctl and envs/ name every other
child, so a new one is forbidden to them too. lint-imports itself checks the imports."""

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
    packages.add("_gen")  # generated at build time (protos/generate.py): in every build, not always in a checkout
    return modules | packages


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layered() -> set[str]:
    contracts = [c for c in _contracts()
                 if c["type"] == "layers" and c.get("containers") == ["inferd.supervisor"]]
    assert len(contracts) == 1, "expected one layers contract over inferd.supervisor"
    return {name.strip("() ") for layer in contracts[0]["layers"] for name in re.split(r"[|:]", layer)}


def test_every_supervisor_child_is_in_a_layer() -> None:
    missing = sorted(_supervisor_children() - _layered())
    assert not missing, f"supervisor children in no layer of the import contract (pyproject.toml): {missing}"


def test_every_layer_name_exists() -> None:
    stale = sorted(_layered() - _supervisor_children())
    assert not stale, f"layers naming no supervisor module or package: {stale}"


@pytest.mark.parametrize("source, allowed", [("ctl", {"ctl", "envs"}), ("envs", {"envs"})])
def test_forbidden_contracts_name_every_other_child(source: str, allowed: set[str]) -> None:
    contracts = [c for c in _contracts()
                 if c["type"] == "forbidden" and c["source_modules"] == [f"inferd.supervisor.{source}"]]
    assert len(contracts) == 1, f"expected one forbidden contract for inferd.supervisor.{source}"
    forbidden = {m.removeprefix("inferd.supervisor.") for m in contracts[0]["forbidden_modules"]}
    assert forbidden == _supervisor_children() - allowed, (
        f"{source}'s forbidden contract: missing {sorted(_supervisor_children() - allowed - forbidden)}, "
        f"stale {sorted(forbidden - _supervisor_children())}")
