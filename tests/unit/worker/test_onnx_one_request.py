"""The onnxruntime backend's one-request path (`_execute_one`, a CPU session's native run) answers as the
general path does: same outputs, datatypes and errors; models it cannot take go the general way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import framework_models as fm  # noqa: E402  (tests/ is on sys.path through the root conftest)
from inferd.worker.backends.base import ModelSpec, Request, Tensor, WorkerContext  # noqa: E402
from inferd.worker.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from inferd.worker.wire.errors import ErrorCode  # noqa: E402

TYPES = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "FP64": np.float64}


def load(tmp_path: Path, datatype: str = "FP32", batch: bool = False) -> OnnxRuntimeBackend:
    io = {key: [{"name": "%s%d" % (key.upper(), i), "data_type": "TYPE_" + datatype, "dims": [16]}
                for i in range(2)] for key in ("input", "output")}
    config = {"name": "m", "max_batch_size": 8 if batch else 0, **io}
    fm.onnx_add_sub(tmp_path, "m", datatype, batch=batch, config=False)
    spec = ModelSpec("m", str(tmp_path / "m"), "1", json.dumps(config), "onnxruntime")
    backend = OnnxRuntimeBackend()
    backend.load(spec, WorkerContext())
    return backend


def request(a: np.ndarray, b: np.ndarray | None, wanted: list[str] | None = None, rid: int = 1) -> Request:
    inputs = [Tensor("INPUT0", "", a)] + ([Tensor("INPUT1", "", b)] if b is not None else [])
    return Request(rid, "", inputs, wanted or [])


def general(backend: OnnxRuntimeBackend, requests: list[Request]) -> list:
    """The same requests through the general path (the one-request path switched off)."""
    native, backend._run_native = backend._run_native, None
    try:
        return backend.execute(requests)
    finally:
        backend._run_native = native


def outputs(response) -> list[tuple[str, str, list]]:
    return [(t.name, t.datatype, t.array.tolist(), t.array.dtype.str) for t in response.outputs]


@pytest.mark.parametrize("datatype", ["FP32", "INT32", "INT64", "FP64"])
def test_one_request_matches_the_general_path(tmp_path, datatype):
    backend = load(tmp_path, datatype)
    assert backend._run_native is not None  # a CPU session: the native run is used
    a = np.arange(16).astype(TYPES[datatype])
    b = np.full(16, 3).astype(TYPES[datatype])
    for wanted in (None, ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"]):
        fast = backend.execute([request(a, b, wanted)])
        slow = general(backend, [request(a, b, wanted)])
        assert fast[0].error is None and outputs(fast[0]) == outputs(slow[0])
    got = {t.name: (t.datatype, t.array) for t in backend.execute([request(a, b)])[0].outputs}
    assert got["OUTPUT0"][0] == datatype and np.array_equal(got["OUTPUT0"][1], a + b)
    assert np.array_equal(got["OUTPUT1"][1], a - b)
    assert [t.name for t in backend.execute([request(a, b, ["OUTPUT1"])])[0].outputs] == ["OUTPUT1"]


def test_missing_input_goes_the_general_way_and_names_it(tmp_path):
    backend = load(tmp_path)
    [response] = backend.execute([request(np.zeros(16, np.float32), None)])
    assert response.error is not None and response.error.code == ErrorCode.INTERNAL
    assert "INPUT1" in response.error.message


def test_run_failures_are_per_request_errors(tmp_path):
    backend = load(tmp_path)
    a = np.zeros(16, np.float32)
    for bad in (request(a, np.zeros(16, np.float64)),  # the model takes FP32
                request(a, a, ["NOPE"])):  # no such output
        [fast] = backend.execute([bad])
        [slow] = general(backend, [bad])
        assert fast.error is not None and fast.error.code == ErrorCode.INTERNAL == slow.error.code
        assert "onnxruntime failed to run model 'm'" in fast.error.message


def test_batches_still_concatenate_and_split(tmp_path):
    backend = load(tmp_path, batch=True)
    rows = [np.full((n, 16), n, np.float32) for n in (1, 2)]
    responses = backend.execute([request(r, r, rid=i) for i, r in enumerate(rows)])
    for r, response in zip(rows, responses):
        got = {t.name: t.array for t in response.outputs}
        assert np.array_equal(got["OUTPUT0"], r + r) and np.array_equal(got["OUTPUT1"], r - r)
    [one] = backend.execute([request(rows[1], rows[1])])
    assert {t.name: t.array.shape for t in one.outputs} == {"OUTPUT0": (2, 16), "OUTPUT1": (2, 16)}


def test_string_models_and_foreign_providers_take_the_general_path(tmp_path):
    backend = load(tmp_path)
    backend._string_inputs = {"INPUT0"}
    backend._prepare_fast_path()
    assert backend._run_native is None
    backend._string_inputs = set()
    backend._gpu = True
    backend._prepare_fast_path()
    assert backend._run_native is None
