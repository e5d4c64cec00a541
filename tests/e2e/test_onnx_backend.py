"""onnxruntime backend end to end: models built with the onnx helper API, served by inferd, queried with
unmodified tritonclient; every answer equals running the same onnxruntime session directly."""

from __future__ import annotations

import concurrent.futures
import json
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import framework_models as fm  # noqa: E402  (tests/ is on sys.path through the root conftest)
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.inferd_only

WRONG_OUTPUT = """name: "onnx_wrong"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnxrepo") / "models"
    paths = {
        "onnx_fp32": fm.onnx_add_sub(repo, "onnx_fp32", "FP32",
                                     extra_config='parameters { key: "intra_op_thread_count" '
                                                  'value: { string_value: "1" } }\n'),
        "onnx_int32": fm.onnx_add_sub(repo, "onnx_int32", "INT32"),
        "onnx_dyn": fm.onnx_add_sub(repo, "onnx_dyn", "FP32", batch=True, max_batch_size=8,
                                    extra_config="dynamic_batching { max_queue_delay_microseconds: 20000 }\n"),
        "onnx_auto": fm.onnx_add_sub(repo, "onnx_auto", "INT32", batch=True, config=False),
        "onnx_ext": fm.onnx_mlp(repo, "onnx_ext", external=True),
    }
    fm.onnx_add_sub(repo, "onnx_wrong", "FP32")
    (repo / "onnx_wrong" / "config.pbtxt").write_text(WRONG_OUTPUT)
    (repo / "trt_plan" / "1").mkdir(parents=True)  # a TensorRT engine where no GPU exists
    (repo / "trt_plan" / "1" / "model.plan").write_bytes(b"\0" * 16)
    return repo, paths


@pytest.fixture(scope="module")
def server(module_server_factory, models):
    repo, paths = models
    return module_server_factory(repo=repo, wait_ready=[*paths, "onnx_wrong"])


@pytest.fixture(scope="module")
def http(server):
    client = server.http_client()
    yield client
    client.close()


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def infer(http, model: str, arrays: dict[str, np.ndarray], datatype: str, outputs=None):
    inputs = []
    for name, array in arrays.items():
        inp = httpclient.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    requested = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
    return http.infer(model, inputs, outputs=requested)


@pytest.mark.parametrize("model,dtype,datatype", [("onnx_fp32", np.float32, "FP32"),
                                                  ("onnx_int32", np.int32, "INT32")])
def test_add_sub_equals_direct_session(http, models, model, dtype, datatype):
    rng = np.random.default_rng(1)
    feeds = {"INPUT0": (rng.standard_normal(16) * 100).astype(dtype),
             "INPUT1": (rng.standard_normal(16) * 100).astype(dtype)}
    expected = session(models[1][model]).run(["OUTPUT0", "OUTPUT1"], feeds)
    result = infer(http, model, feeds, datatype)
    for name, want in zip(("OUTPUT0", "OUTPUT1"), expected):
        got = result.as_numpy(name)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    only = infer(http, model, feeds, datatype, outputs=["OUTPUT1"])
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), expected[1])
    assert only.as_numpy("OUTPUT0") is None


def test_dynamic_batch_concurrent_requests_equal_one_by_one(http, server, models):
    direct = session(models[1]["onnx_dyn"])
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(12)]

    def one(a):
        client = server.http_client()  # one client per thread: a tritonclient.http client is not thread-safe
        try:
            return infer(client, "onnx_dyn", {"INPUT0": a, "INPUT1": a * 0.5}, "FP32")
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, batches))
    for a, result in zip(batches, results):
        want = direct.run(None, {"INPUT0": a, "INPUT1": a * 0.5})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), want[0])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), want[1])
    stats = http.get_inference_statistics("onnx_dyn")["model_stats"][0]
    assert 1 <= int(stats["execution_count"]) <= len(batches)


def test_auto_complete_without_config(http, server, models):
    config = http.get_model_config("onnx_auto")
    assert config["backend"] == "onnxruntime" and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
    assert {g["kind"] for g in config["instance_group"]} == {"KIND_CPU"}
    assert sum(g["count"] for g in config["instance_group"]) == 2
    meta = http.get_model_metadata("onnx_auto")
    assert meta["inputs"][0]["shape"] == [-1, 16]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    result = infer(http, "onnx_auto", {"INPUT0": a, "INPUT1": a}, "INT32")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_external_data_directory(http, models):
    path = models[1]["onnx_ext"]
    assert path.parent.is_dir() and (path.parent / "weights.bin").stat().st_size > 1024 * 256 * 4
    x = np.random.default_rng(3).standard_normal((3, 1024)).astype(np.float32)
    want = session(path).run(None, {"X": x})[0]
    np.testing.assert_array_equal(infer(http, "onnx_ext", {"X": x}, "FP32").as_numpy("Y"), want)


def test_wrong_output_datatype_is_internal_naming_the_model(http, server):
    a = np.ones(16, np.float32)
    with pytest.raises(InferenceServerException) as info:
        infer(http, "onnx_wrong", {"INPUT0": a, "INPUT1": a}, "FP32")
    assert "onnx_wrong" in str(info.value) and "OUTPUT0" in str(info.value)
    assert info.value.status() == "500" or "INTERNAL" in str(info.value.status()).upper()
    # the server goes on serving its other models
    np.testing.assert_array_equal(infer(http, "onnx_fp32", {"INPUT0": a, "INPUT1": a}, "FP32")
                                  .as_numpy("OUTPUT0"), a * 2)


def test_grpc_infer(server, models):
    import tritonclient.grpc as grpcclient

    client = server.grpc_client()
    try:
        a = np.arange(16, dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [16], "FP32"), grpcclient.InferInput("INPUT1", [16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("onnx_fp32", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(16, np.float32))
    finally:
        client.close()
    status = json.loads(server.get("/v2/models/onnx_fp32/config")[1])
    assert status["parameters"]["intra_op_thread_count"]["string_value"] == "1"


def test_tensorrt_without_gpu_is_unavailable_with_reason(server, http):
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present: tests/gpu covers TensorRT")
    entry = server.wait_until(lambda: {e["name"]: e for e in http.get_model_repository_index()}["trt_plan"]
                              if "reason" in {e["name"]: e for e in http.get_model_repository_index()}["trt_plan"]
                              else None, timeout=30, what="trt_plan failed")
    assert entry["state"] == "UNAVAILABLE"
    assert "TensorRT needs an NVIDIA GPU" in entry["reason"]
    assert http.is_model_ready("onnx_fp32") and not http.is_model_ready("trt_plan")
