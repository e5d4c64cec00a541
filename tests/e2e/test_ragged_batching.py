"""Ragged batching end to end (docs/ragged-batching.md; Triton's qa/L0_batch_input): requests whose ragged
input differs in shape share one batch.

- Python model (tests/fixtures/models/ragged_py), also run against Triton 2.51 (INFERD_E2E_TARGET=triton):
  execute() gets the requests of the batch one by one with their own inputs; batch_input tensors are
  given to nothing and batch_output scatters nothing (Triton's python backend ignores both); the config
  shows them as written; a bad batch_input / batch_output fails the load with Triton's message.
- ONNX Runtime and TorchScript models built here (tests/framework_models.py, `ragged_config`): the ragged
  input arrives as one 1-D tensor, every batch_input kind arrives with the values Triton's
  model_config.proto defines (a numpy reference, `fm.ragged_reference`), and the batch output goes back
  to each request in its input's shape.

Requests go in order on one gRPC stream, as in L0_batch_input, so the batch order is known; the models'
batch delay is 30 s and the requests fill max_batch_size, so the batch forms when the last one arrives.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path

import framework_models as fm
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PY_SHAPES = [(1, 2), (1, 4), (1, 1), (2, 3)]  # 5 batch items: ragged_py's max_batch_size
FW_SHAPES = [(1, 4, 1), (1, 1, 2), (2, 1, 2), (1, 2, 2)]  # L0_batch_input's item shapes, 5 batch items


def stream_infer(server, model: str, arrays: list[np.ndarray], outputs: list[str]) -> list:
    """One request per array (input RAGGED_INPUT) in order on one gRPC stream; the results in that order."""
    client = server.grpc_client()
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, array in enumerate(arrays):
            inp = grpcclient.InferInput("RAGGED_INPUT", list(array.shape), "FP32")
            inp.set_data_from_numpy(array)
            client.async_stream_infer(model, [inp], request_id=str(i),
                                      outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
        by_id = {}
        for _ in arrays:
            result, error = answers.get(timeout=60)
            assert error is None, error
            by_id[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()
    return [by_id[str(i)] for i in range(len(arrays))]


def ragged_arrays(shapes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


# ---- Python model: as Triton 2.51 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def py_server(module_server_factory):
    return module_server_factory(["ragged_py"])


def test_python_config_shows_batch_io_as_written(py_server):
    client = py_server.http_client()
    try:
        config = client.get_model_config("ragged_py")
    finally:
        client.close()
    source = {"source_input": ["RAGGED_INPUT"]}
    assert config["batch_input"] == [
        {"kind": "BATCH_ELEMENT_COUNT", "target_name": ["COUNT"], "data_type": "TYPE_FP32", **source},
        {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT", "target_name": ["ACC"], "data_type": "TYPE_INT32", **source},
        {"kind": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "target_name": ["ACC0"], "data_type": "TYPE_FP32",
         **source},
        {"kind": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "target_name": ["MAXS"], "data_type": "TYPE_INT32", **source},
        {"kind": "BATCH_ITEM_SHAPE", "target_name": ["ITEM", "ITEM2"], "data_type": "TYPE_FP32", **source},
        {"kind": "BATCH_ITEM_SHAPE_FLATTEN", "target_name": ["FLAT"], "data_type": "TYPE_INT32", **source},
    ]
    assert config["batch_output"] == [
        {"target_name": ["RAGGED_OUTPUT"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", **source}]
    assert config["input"][0]["allow_ragged_batch"] is True


def test_python_ragged_requests_share_one_execute_each_with_its_own_input(py_server):
    arrays = ragged_arrays(PY_SHAPES)
    results = stream_infer(py_server, "ragged_py", arrays, ["INFO", "RAGGED_OUTPUT"])
    for array, result in zip(arrays, results):
        info = result.as_numpy("INFO")
        assert info.shape == (array.shape[0], 1)
        seen = json.loads(info[0][0])
        assert seen == {"batch": 4, "inputs": {"RAGGED_INPUT": list(array.shape)}, "targets_found": []}
        # batch_output scatters nothing for a Python model: RAGGED_OUTPUT comes back as the model made it
        assert np.array_equal(result.as_numpy("RAGGED_OUTPUT"), (array * 2).reshape(-1))


BAD_BATCH_IO = {  # model name -> (config lines after the I/O, Triton 2.51's message)
    "bi_no_source": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_FP32 } ]',
                     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for bi_no_source"),
    "bi_two_sources": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_FP32 '
                       'source_input: ["R", "B"] } ]',
                       "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for bi_two_sources"),
    "bi_int64": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_INT64 '
                 'source_input: "R" } ]', "batch input data type must be TYPE_INT32 or TYPE_FP32 for bi_int64"),
    "bi_unknown_source": ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_FP32 '
                          'source_input: "NOPE" } ]', "unknown source input name 'NOPE' for bi_unknown_source"),
    "bo_no_source": ('batch_output [ { target_name: "O" kind: BATCH_SCATTER_WITH_INPUT_SHAPE } ]',
                     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for "
                     "bo_no_source"),
    "bo_unknown_source": ('batch_output [ { target_name: "O" source_input: "NOPE" } ]',
                          "unknown source input name 'NOPE' for bo_unknown_source"),
    "bo_unknown_target": ('batch_output [ { target_name: "NOPE" source_input: "R" } ]',
                          "unknown target output name 'NOPE' for bo_unknown_target"),
    "bo_twice": ('batch_output [ { target_name: ["O", "O"] source_input: "R" } ]',
                 "target output name 'O' can only be specified once for bo_twice"),
}
BAD_IO = """backend: "python"
max_batch_size: 8
input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "O" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def test_bad_batch_io_fails_the_load_with_tritons_message(server_factory, tmp_path):
    repo = tmp_path / "models"
    model_py = (Path(__file__).parents[1] / "fixtures" / "models" / "ragged_py" / "1" / "model.py").read_text()
    for name, (extra, _) in BAD_BATCH_IO.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(BAD_IO + extra + "\n")
        (repo / name / "1" / "model.py").write_text(model_py)
    server = server_factory(repo=repo, control_mode="explicit")
    client = server.http_client()
    try:
        for name, (_, message) in BAD_BATCH_IO.items():
            with pytest.raises(InferenceServerException) as info:
                client.load_model(name)
            assert message in str(info.value), name
    finally:
        client.close()


# ---- ONNX Runtime and TorchScript: values from Triton's definitions ---------------------------------


@pytest.fixture(scope="module")
def fw_models(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    repo = tmp_path_factory.mktemp("raggedrepo") / "models"
    fm.onnx_ragged(repo, "onnx_ragged")
    fm.torch_ragged(repo, "pt_ragged")
    # the ragged input is 2-D in this model: Triton's onnxruntime backend refuses to load it
    fm.onnx_add_sub(repo, "onnx_ragged_2d", "FP32", dims=(4,), batch=True, max_batch_size=4)
    config = (repo / "onnx_ragged_2d" / "config.pbtxt").read_text()
    (repo / "onnx_ragged_2d" / "config.pbtxt").write_text(
        config.replace('dims: [ 4 ] }', 'dims: [ 4 ] allow_ragged_batch: true }', 1))
    return repo


@pytest.fixture(scope="module")
def fw_server(module_server_factory, fw_models):
    return module_server_factory(repo=fw_models, wait_ready=["onnx_ragged", "pt_ragged"])


@pytest.mark.inferd_only
@pytest.mark.parametrize("model", ["onnx_ragged", "pt_ragged"])
def test_framework_batch_of_four_gets_every_batch_input_kind(fw_server, model):
    arrays = ragged_arrays(FW_SHAPES, seed=1)
    results = stream_infer(fw_server, model, arrays, list(fm.RAGGED_OUTPUTS))
    expected = fm.ragged_reference(FW_SHAPES)
    for array, result, want in zip(arrays, results, expected):
        got = result.as_numpy("RAGGED_OUTPUT")  # scattered back in the request's own shape
        assert got.shape == array.shape and np.allclose(got, array * 2)
        for name, value in want.items():
            assert np.array_equal(result.as_numpy(name), value), (name, result.as_numpy(name), value)


@pytest.mark.inferd_only
@pytest.mark.parametrize("model", ["onnx_ragged", "pt_ragged"])
def test_framework_one_request_alone_is_flattened_too(fw_server, model):
    array = ragged_arrays([(5, 1, 3)], seed=2)[0]  # fills the batch by itself
    client = fw_server.http_client()
    try:
        inp = httpclient.InferInput("RAGGED_INPUT", list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        result = client.infer(model, [inp])
    finally:
        client.close()
    assert np.allclose(result.as_numpy("RAGGED_OUTPUT"), array * 2)
    for name, value in fm.ragged_reference([array.shape])[0].items():
        assert np.array_equal(result.as_numpy(name), value), name


@pytest.mark.inferd_only
def test_onnx_ragged_input_must_be_one_dimensional_in_the_model(fw_server):
    status, body = fw_server.post("/v2/repository/index")
    entry = next(e for e in json.loads(body) if e["name"] == "onnx_ragged_2d")
    assert entry.get("state") == "UNAVAILABLE"
    assert "configuration expects model provides input with shape [-1] for ragged input 'INPUT0'" in entry["reason"]
