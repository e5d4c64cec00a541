"""Framework backends in-process: lazy imports, missing packages, batching helpers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.backends import create, framework
from inferd.worker.backends.base import ModelSpec, Request, Tensor, WorkerContext
from inferd.worker.wire.errors import ErrorCode, InferdError

REPO_ROOT = Path(__file__).resolve().parents[3]


def spec(tmp_path: Path, backend: str, filename: str, config: dict | None = None) -> ModelSpec:
    (tmp_path / "m" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "m" / "1" / filename).write_bytes(b"not a model")
    return ModelSpec("m", str(tmp_path / "m"), "1", json.dumps(dict(config or {}, name="m")), backend)


@pytest.mark.parametrize("backend,module,filename,hint", [
    ("onnxruntime", "onnxruntime", "model.onnx", "pip install 'inferd[onnx]'"),
    ("pytorch", "torch", "model.pt", "pip install 'inferd[torch]'"),
])
def test_missing_package_is_unavailable_with_install_hint(tmp_path, monkeypatch, backend, module, filename, hint):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(InferdError) as info:
        create(backend).load(spec(tmp_path, backend, filename), WorkerContext())
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert hint in info.value.message and module in info.value.message


def test_tensorrt_without_gpu_is_unavailable(tmp_path):
    backend = create("tensorrt")
    model = spec(tmp_path, "tensorrt", "model.plan")
    for call in (lambda: backend.load(model, WorkerContext()), lambda: backend.auto_complete(model, {})):
        with pytest.raises(InferdError) as info:
            call()
        assert info.value.code == ErrorCode.UNAVAILABLE
        assert "TensorRT needs an NVIDIA GPU" in info.value.message


def test_python_worker_never_imports_framework_packages():
    code = ("import sys; from inferd.worker.backends import create; create('python'); "
            "import inferd.worker.message_loop; "
            "print(sorted(m for m in ('onnxruntime', 'torch', 'tensorrt', 'onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def req(i: int, rows: int, width: int = 3) -> Request:
    x = np.full((rows, width), i, np.float32)
    return Request(i, str(i), [Tensor("X", "FP32", x)], [])


def test_batch_requests_concatenates_and_splits_back():
    requests = [req(1, 2), req(2, 1), req(3, 3)]
    merged = framework.batch_requests(requests, batching=True)
    assert merged is not None
    feeds, sizes = merged
    assert feeds["X"].shape == (6, 3) and sizes == [2, 1, 3]
    responses = framework.split_batch(requests, [("Y", feeds["X"] * 2)], sizes, ["Y"])
    assert [r.outputs[0].array[:, 0].tolist() for r in responses] == [[2, 2], [4], [6, 6, 6]]


def test_batch_requests_refuses_mismatched_shapes_or_no_batching():
    assert framework.batch_requests([req(1, 2), req(2, 2, width=4)], batching=True) is None
    assert framework.batch_requests([req(1, 2), req(2, 2)], batching=False) is None


def test_parameters_and_bad_integer():
    config = {"parameters": {"intra_op_thread_count": {"string_value": "2"}, "x": {"string_value": "a"}}}
    assert framework.int_parameter(config, "intra_op_thread_count") == 2
    assert framework.int_parameter(config, "missing", 7) == 7
    with pytest.raises(InferdError):
        framework.int_parameter(config, "x")
