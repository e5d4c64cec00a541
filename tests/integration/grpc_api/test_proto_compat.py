"""Our protos must be wire- and name-identical to tritonclient's, and parse real config.pbtxt files.

The descriptor dumps run in two subprocesses: both module sets register the same `inference.*`
names, which one protobuf descriptor pool refuses (DESIGN.md, Known traps).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _dump(which: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE / "_dump_descriptors.py"), which],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def dumps() -> tuple[dict, dict]:
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py")], check=True, cwd=ROOT)
    return _dump("ours"), _dump("tritonclient")


def test_every_tritonclient_message_and_field_matches(dumps: tuple[dict, dict]) -> None:
    ours, theirs = dumps
    assert ours["files"] == theirs["files"]
    problems = []
    for name, msg in theirs["messages"].items():
        mine = ours["messages"].get(name)
        if mine is None:
            problems.append(f"missing message {name}")
            continue
        if mine["map_entry"] != msg["map_entry"]:
            problems.append(f"{name}: map_entry differs")
        for fname, field in msg["fields"].items():
            if mine["fields"].get(fname) != field:
                problems.append(f"{name}.{fname}: ours {mine['fields'].get(fname)}, tritonclient {field}")
    assert not problems, "\n".join(problems)


def test_enums_and_services_match(dumps: tuple[dict, dict]) -> None:
    ours, theirs = dumps
    for name, values in theirs["enums"].items():
        assert ours["enums"].get(name) == values, name
    assert ours["services"] == theirs["services"]
    assert "ModelStreamInfer" in ours["services"]["inference.GRPCInferenceService"]


def test_health_and_config_pbtxt_parsing() -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "_proto_checks.py")], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_serialized_descriptors_identical(dumps: tuple[dict, dict]) -> None:
    # Byte-identical file descriptors let both module sets coexist in one process's default pool.
    ours, theirs = dumps
    assert ours["serialized"] == theirs["serialized"]
