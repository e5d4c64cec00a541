"""fuzz/run.py end to end on a throwaway target tree (INFERD_FUZZ_DIR): a coverage-guided run reports
executions and coverage, saves what it finds and names it; the fallback engine finds it too; --replay
reproduces it from the saved file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).resolve().parents[3] / "fuzz" / "run.py"

LIB = '''
def check(data: bytes) -> None:
    if len(data) > 3 and data[0] == ord("k"):
        if data[1] == ord("o"):
            raise ValueError("found the planted bug")
'''
TARGET = '''
from _boomlib import check

INSTRUMENT = ("_boomlib",)


def test_one_input(data: bytes) -> None:
    check(data)
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "_boomlib.py").write_text(LIB)
    (tmp_path / "targets" / "boom.py").write_text(TARGET)
    (tmp_path / "corpus" / "boom").mkdir(parents=True)
    (tmp_path / "corpus" / "boom" / "seed").write_bytes(b"kx12")
    return tmp_path


def run(tree: Path, *args: str) -> tuple[int, Any]:
    proc = subprocess.run([sys.executable, str(RUN), *args], env={**os.environ, "INFERD_FUZZ_DIR": str(tree)},
                          capture_output=True, text=True, timeout=120)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"run.py printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def test_replay_of_a_clean_corpus(tree: Path) -> None:
    rc, out = run(tree, "--replay", "--json")
    assert rc == 0 and out == [{"target": "boom", "inputs": 1, "seconds": out[0]["seconds"], "failures": []}]


def test_a_coverage_guided_run_finds_the_planted_bug_and_replay_reproduces_it(tree: Path) -> None:
    pytest.importorskip("atheris")
    rc, out = run(tree, "--seconds", "60", "--json", "boom")
    (rep,) = out
    assert rc == 1 and rep["engine"] == "atheris" and rep["executions"] > 0
    assert rep["cov"] and rep["ft"], rep  # the helper module is instrumented
    assert len(rep["signatures"]) == 1 and rep["signatures"][0].startswith("ValueError at "), rep
    assert "_boomlib.py" in rep["signatures"][0]
    saved = Path(rep["findings"][0])
    assert saved.parent == tree / "findings" / "boom" and saved.read_bytes()[:2] == b"ko"
    rc, out = run(tree, "--replay", "--json", "boom", "--input", str(saved))
    assert rc == 1 and "found the planted bug" in out[0]["failures"][0]["error"]


def test_the_mutation_engine_finds_it_without_atheris(tree: Path) -> None:
    rc, out = run(tree, "--engine", "mutate", "--seconds", "30", "--json", "boom")
    (rep,) = out
    assert rc == 1 and rep["engine"] == "mutate" and rep["cov"] is None and "atheris" in rep["note"]
    assert (tree / "findings" / "boom").is_dir() and rep["findings"]
