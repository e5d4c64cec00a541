"""model_warmup (reference/triton.md §3.9): samples run on every instance before the model is READY.

Behaviour pinned against Triton 2.51 (INFERD_E2E_TARGET=triton passes the tests not marked
inferd_only): a sample is `batch_size` requests in one execution, each input `dims` with a batch
dimension of 1 in front for batching models; `batch_size` 0 skips the sample, `count` 0 runs it
once; BYTES zero_data and random_data are empty elements; input_data_file gives the file's first
bytes; inputs the config does not declare reach the model as given; warmup executions count in the
statistics; a failing sample fails the load, the error and the index reason naming it.

The fixture models (tests/fixtures/models/warmup_*) record every batch they execute in
<model dir>/seen.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

MODELS = {
    "wu_record": "warmup_record",
    "wu_stats": "warmup_nobatch",
    "wu_decoupled": "warmup_decoupled",
    "wu_decoupled_error": "warmup_decoupled",
    "wu_refuse": "warmup_nobatch",
    "wu_error_response": "warmup_nobatch",
    "wu_override": "warmup_nobatch",
    "wu_restart": "warmup_nobatch",
    "wu_restart_refuse": "warmup_nobatch",
}
LOADED = ["wu_record", "wu_stats", "wu_decoupled"]


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS, control_mode="explicit", load_models=LOADED)


@pytest.fixture(scope="module")
def http(server):
    client = server.http_client()
    yield client
    client.close()


def seen(server, model: str) -> list[dict]:
    path = Path(server.repo) / model / "seen.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def index_entry(http, name: str) -> dict:
    return next(e for e in http.get_model_repository_index() if e["name"] == name)


def failed_load(http, name: str, config: dict | None = None) -> tuple[str, dict]:
    """(the load error, the model's index entry) of a load that must fail."""
    with pytest.raises(InferenceServerException) as info:
        if config is None:
            http.load_model(name)
        else:
            http.load_model(name, config=json.dumps(config))
    entry = index_entry(http, name)
    assert entry.get("state") == "UNAVAILABLE", entry
    assert not http.is_model_ready(name)
    return str(info.value), entry


def values(inp: dict) -> list:
    return inp["values"]


# ---------------------------------------------------------------------------- samples as the model sees them


def test_every_instance_runs_every_sample_before_ready(server, http):
    records = seen(server, "wu_record")
    by_instance: dict[str, list[dict]] = {}
    for rec in records:
        by_instance.setdefault(rec["instance"], []).append(rec)
    assert len(by_instance) == 2, by_instance.keys()  # instance_group count 2: each warmed
    for runs in by_instance.values():
        # zeros x count 2, random, (skipped: batch_size 0), from_files (count 0 = once), in config order
        assert [len(r["requests"]) for r in runs] == [2, 2, 1, 1], runs
        for run in runs[:2]:  # zeros: batch_size 2 = two requests of [1] + dims in one execution
            for req in run["requests"]:
                assert req["id"] == ""
                ins = {i["name"]: i for i in req["inputs"]}
                assert set(ins) == {"F", "S", "I"}
                assert ins["F"]["dtype"] == "float32" and ins["F"]["shape"] == [1, 3]
                assert values(ins["F"]) == [0.0, 0.0, 0.0]
                assert ins["S"]["dtype"] == "object" and ins["S"]["shape"] == [1, 2]
                assert values(ins["S"]) == ["", ""]  # BYTES zero_data: empty elements
                assert ins["I"]["dtype"] == "int32" and ins["I"]["shape"] == [1, 4]
                assert values(ins["I"]) == [0, 0, 0, 0]
        ins = {i["name"]: i for i in runs[2]["requests"][0]["inputs"]}  # random
        assert ins["F"]["shape"] == [1, 3] and ins["I"]["shape"] == [1, 2]
        assert values(ins["S"]) == ["", ""]  # BYTES random_data: empty elements too
        ins = {i["name"]: i for i in runs[3]["requests"][0]["inputs"]}  # from_files
        assert values(ins["F"]) == [1.5, 2.5, 3.5]  # the file's first 12 of 16 bytes
        assert values(ins["S"]) == ["hello", "warm"]
        assert values(ins["I"]) == [7, 8]
        # an input the config does not declare reaches the model as given
        assert ins["EXTRA"]["shape"] == [1, 2] and values(ins["EXTRA"]) == [0, 0]


def test_warmup_counts_in_statistics(http):
    stats = http.get_inference_statistics("wu_stats")["model_stats"][0]
    assert stats["inference_count"] == 1
    assert stats["execution_count"] == 1
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert [b["batch_size"] for b in stats["batch_stats"]] == [1]
    assert stats["last_inference"] > 0
    record = http.get_inference_statistics("wu_record")["model_stats"][0]
    # two instances x (2 x 2 zeros + 1 random + 1 from_files)
    assert record["inference_count"] == 12
    assert record["execution_count"] == 8
    assert record["inference_stats"]["success"]["count"] == 12


def test_non_batching_model_gets_dims_without_batch_dimension(server):
    [rec] = seen(server, "wu_stats")
    [req] = rec["requests"]
    assert req["inputs"] == [{"name": "F", "dtype": "float32", "shape": [3], "values": [0.0, 0.0, 0.0]}]


def test_model_serves_after_warmup(server, http):
    inp = httpclient.InferInput("F", [3], "FP32")
    inp.set_data_from_numpy(np.array([5, 6, 7], dtype=np.float32))
    result = http.infer("wu_stats", [inp])
    assert result.as_numpy("OUT").tolist() == [1]  # the warmup was this process's first batch


def test_decoupled_model_is_warmed(server, http):
    assert http.is_model_ready("wu_decoupled")
    assert seen(server, "wu_decoupled") == [{"n": 2, "shapes": [[1, 3], [1, 3]]}]


# ---------------------------------------------------------------------------- failures fail the load


def test_sample_whose_execute_raises_fails_the_load(server, http):
    (Path(server.repo) / "wu_refuse" / "REFUSE").write_text("no warmup today")
    message, entry = failed_load(http, "wu_refuse")
    for text in (message, entry.get("reason", "")):
        assert "failed to run warmup sample 'single'" in text
        assert "warmup_record refuses: no warmup today" in text
    assert len(seen(server, "wu_refuse")) == 1  # it ran, once


def test_error_response_fails_the_load(server, http):
    (Path(server.repo) / "wu_error_response" / "ERROR_RESPONSE").write_text("")
    message, entry = failed_load(http, "wu_error_response")
    for text in (message, entry.get("reason", "")):
        assert "failed to run warmup sample 'single'" in text
        assert "warmup_record error response" in text


def test_decoupled_error_response_fails_the_load(server, http):
    (Path(server.repo) / "wu_decoupled_error" / "ERROR_RESPONSE").write_text("")
    message, entry = failed_load(http, "wu_decoupled_error")
    for text in (message, entry.get("reason", "")):
        assert "failed to run warmup sample 'pair'" in text
        assert "warmup_decoupled error response" in text


def _config(warmup: list[dict], max_batch_size: int = 0) -> dict:
    return {
        "name": "wu_override", "backend": "python", "max_batch_size": max_batch_size,
        "input": [{"name": "F", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "model_warmup": warmup,
    }


def _sample(inp: dict, batch_size: int = 1, name: str = "bad") -> dict:
    return {"name": name, "batch_size": batch_size, "inputs": {"F": inp}}


BAD_SAMPLES = {
    "variable_dims": (_sample({"data_type": "TYPE_FP32", "dims": [-1], "zero_data": True}),
                      ["warmup setting expects all variable-size dimensions are specified for input 'F'"]),
    "missing_file": (_sample({"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "missing.bin"}),
                     ["missing.bin", "No such file or directory"]),
    "short_file": (_sample({"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "f32.bin"}),
                   ["expects 12 bytes", "f32.bin", "has 8 bytes"]),
    "no_data": (_sample({"data_type": "TYPE_FP32", "dims": [3]}),
                ["warmup setting expects input 'F' to have input_data_type set"]),
    "wrong_datatype": (_sample({"data_type": "TYPE_INT32", "dims": [3], "zero_data": True}),
                       ["inference input 'F' data-type is 'INT32', but model 'wu_override' expects 'FP32'"]),
    "wrong_dims": (_sample({"data_type": "TYPE_FP32", "dims": [5], "zero_data": True}),
                   ["unexpected shape for input 'F' for model 'wu_override'. Expected [3], got [5]"]),
    "batch_too_large": (_sample({"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}, batch_size=2),
                        ["failed to run warmup sample 'bad'", "batch size 2 for 'wu_override",
                         "max allowed is 0"]),
    "missing_input": ({"name": "bad", "batch_size": 1, "inputs": {}},
                      ["expected 1 inputs but got 0 inputs for model 'wu_override'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_SAMPLES))
def test_malformed_sample_fails_the_load(http, case):
    sample, expected = BAD_SAMPLES[case]
    ok = {"name": "fine", "batch_size": 1,
          "inputs": {"F": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}}}
    message, entry = failed_load(http, "wu_override", _config([ok, sample]))
    for text in (message, entry.get("reason", "")):
        for part in expected:
            assert part in text, (part, text)


# Triton 2.51 crashes (memset on a failed allocation) on the first and reads any path for the second
INFERD_ONLY_SAMPLES = {
    "absurd_dims": (_sample({"data_type": "TYPE_FP32", "dims": [1 << 40, 1 << 20], "zero_data": True}),
                    ["invalid warmup sample 'bad'", "takes the sample beyond the", "bytes a warmup sample may hold"]),
    "file_outside_warmup_dir": (_sample({"data_type": "TYPE_FP32", "dims": [3],
                                         "input_data_file": "../config.pbtxt"}),
                                ["invalid warmup sample 'bad'", "must name a file inside the model's 'warmup'"]),
    "absurd_count": ({"name": "bad", "batch_size": 1, "count": 1 << 31,
                      "inputs": {"F": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": True}}},
                     ["invalid warmup sample 'bad'", "count must be an integer from 0 to"]),
}


@pytest.mark.inferd_only
@pytest.mark.parametrize("case", sorted(INFERD_ONLY_SAMPLES))
def test_sample_sizes_are_bounded(http, case):
    sample, expected = INFERD_ONLY_SAMPLES[case]
    message, entry = failed_load(http, "wu_override", _config([sample]))
    for text in (message, entry.get("reason", "")):
        for part in expected:
            assert part in text, (part, text)


def test_overridden_samples_load(server, http):
    """A config override's samples run too (after the failures above the same name loads)."""
    (Path(server.repo) / "wu_override" / "seen.jsonl").unlink(missing_ok=True)
    sample = {"name": "twice", "batch_size": 1, "count": 2,
              "inputs": {"F": {"data_type": "TYPE_FP32", "dims": [2], "input_data_file": "f32.bin"}}}
    cfg = _config([sample])
    cfg["input"][0]["dims"] = [-1]
    http.load_model("wu_override", config=json.dumps(cfg))
    assert http.is_model_ready("wu_override")
    runs = seen(server, "wu_override")
    assert [r["requests"][0]["inputs"][0]["values"] for r in runs] == [[1.0, 2.0], [1.0, 2.0]]
    http.unload_model("wu_override")


# ---------------------------------------------------------------------------- restarts (inferd only)


def _crash(http, model: str) -> None:
    inp = httpclient.InferInput("F", [3], "FP32")
    inp.set_data_from_numpy(np.array([-1, 0, 0], dtype=np.float32))
    with pytest.raises(InferenceServerException):
        http.infer(model, [inp])


@pytest.mark.inferd_only
def test_restarted_worker_is_warmed_before_it_serves(server, http):
    http.load_model("wu_restart")
    [first] = server.worker_pids("wu_restart")
    _crash(http, "wu_restart")
    server.wait_until(lambda: (p := server.worker_pids("wu_restart")) and p[0] != first
                      and http.is_model_ready("wu_restart"), timeout=30, what="wu_restart restarted")
    [second] = server.worker_pids("wu_restart")
    inp = httpclient.InferInput("F", [3], "FP32")
    inp.set_data_from_numpy(np.array([5, 6, 7], dtype=np.float32))
    assert http.infer("wu_restart", [inp]).as_numpy("OUT").tolist() == [1]  # warmup was batch 0
    runs = [r for r in seen(server, "wu_restart") if r["pid"] == second]
    assert [r["requests"][0]["inputs"][0]["values"] for r in runs] == [[0.0, 0.0, 0.0], [5.0, 6.0, 7.0]]


@pytest.mark.inferd_only
def test_restart_whose_warmup_fails_does_not_serve(server, http):
    http.load_model("wu_restart_refuse")
    (Path(server.repo) / "wu_restart_refuse" / "REFUSE").write_text("not after a crash")
    _crash(http, "wu_restart_refuse")

    def refused():
        [inst] = server.instances("wu_restart_refuse")
        return "failed to run warmup sample 'single'" in inst["last_error"] and inst

    inst = server.wait_until(refused, timeout=30, what="a restart refused by its warmup")
    assert "warmup_record refuses: not after a crash" in inst["last_error"]
    assert inst["state"] != "ready"
    assert not http.is_model_ready("wu_restart_refuse")
