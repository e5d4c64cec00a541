"""JSON rendering and normalisation against what real Triton 2.51 served (golden/, see golden/README.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inferd.supervisor.repository import autocomplete, layout, metadata
from inferd.supervisor.repository import config as C

GOLDEN = Path(__file__).parent / "golden"
NAMES = sorted(p.name[: -len(".config.json")] for p in GOLDEN.glob("*.config.json"))

# Fields our proto has that Triton 2.51's does not (our model_config.proto follows a newer Triton).
NEWER_FIELDS: dict[str, list[tuple[str, ...]]] = {"ens": [("ensemble_scheduling", "max_inflight_requests")]}


def _drop(d: dict[str, Any], path: tuple[str, ...]) -> None:
    for key in path[:-1]:
        d = d[key]
    d.pop(path[-1], None)


# What each model's auto_complete_config did in Triton (golden/make_triton_repo.sh), done the way
# pb_utils.ModelConfig does it: on the JSON dict the worker receives.
def _auto_all(d: dict[str, Any]) -> None:
    d["max_batch_size"] = 4
    d["input"].append({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
    d["output"].append({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
    d.setdefault("dynamic_batching", {})
    d["model_transaction_policy"] = {"decoupled": False}


def _auto_mbs_change(d: dict[str, Any]) -> None:
    d["max_batch_size"] = 6


AUTOCOMPLETE: dict[str, Callable[[dict[str, Any]], None]] = {
    "auto_all": _auto_all, "auto_mbs_change": _auto_mbs_change,
}


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("golden") / "repo"
    subprocess.run(["bash", str(GOLDEN / "make_triton_repo.sh"), str(root)], check=True, capture_output=True)
    return root


def served_config(root: Path, name: str) -> dict[str, Any]:
    """What inferd's model manager would serve for GET /v2/models/<name>/config."""
    src = layout.read_model(str(root), name)
    cfg = C.normalize(C.load_config(src), src)
    if autocomplete.needs_autocomplete(cfg, disable_flag=False):
        answer = C.to_json_dict(cfg)  # what the worker receives...
        if name in AUTOCOMPLETE:
            AUTOCOMPLETE[name](answer)  # ...and what auto_complete_config makes of it
        cfg = C.normalize(autocomplete.apply_autocompleted(cfg, json.dumps(answer)), src)
    return C.to_json_dict(cfg)


@pytest.mark.parametrize("name", NAMES)
def test_config_json_matches_triton(triton_repo: Path, name: str) -> None:
    expected = json.loads((GOLDEN / f"{name}.config.json").read_text())
    got = served_config(triton_repo, name)
    for path in NEWER_FIELDS.get(name, []):
        _drop(got, path)
    assert got == expected
    assert list(got) == list(expected), "top-level key order differs from Triton's"


def test_int64_quoting_follows_triton() -> None:
    full = json.loads((GOLDEN / "full.config.json").read_text())
    assert full["optimization"]["cuda"]["graph_spec"][0]["input"]["IN0"]["dim"] == ["2", "2"]
    assert full["dynamic_batching"]["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7000
    seqdirect = json.loads((GOLDEN / "seqdirect.config.json").read_text())
    assert seqdirect["sequence_batching"]["state"][0]["initial_state"][0]["dims"] == ["1"]
    assert seqdirect["sequence_batching"]["state"][0]["dims"] == [1]
    secdev = json.loads((GOLDEN / "secdev.config.json").read_text())
    assert secdev["instance_group"][0]["secondary_devices"][0]["device_id"] == "1"


def test_metadata_matches_triton(triton_repo: Path) -> None:
    expected = json.loads((GOLDEN / "metadata.json").read_text())
    ready = {"add_sub": [1], "versions_mixed": [0, 1, 2], "full": [1, 3]}
    for name, versions in ready.items():
        src = layout.read_model(str(triton_repo), name)
        cfg = C.normalize(C.load_config(src), src)
        assert metadata.model_metadata(cfg, versions) == expected[name], name
