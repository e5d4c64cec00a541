"""Framework backends on an NVIDIA GPU: onnxruntime's CUDA execution provider, TorchScript on CUDA and
a TensorRT engine built by the test. Marked `gpu` (run with `make test-gpu`); each test skips cleanly
where no GPU or no GPU package is present."""

from __future__ import annotations

import os

import framework_models as fm
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.inferd_only]

GPU_GROUP = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU on this machine")


def _infer(server, model, arrays, datatype):
    import tritonclient.http as httpclient

    client = server.http_client()
    try:
        inputs = []
        for name, array in arrays.items():
            inp = httpclient.InferInput(name, list(array.shape), datatype)
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        return client.infer(model, inputs)
    finally:
        client.close()


@requires_gpu
def test_onnxruntime_cuda_execution_provider(server_factory, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime without the CUDA execution provider (pip install 'inferd[gpu]')")
    repo = tmp_path / "models"
    path = fm.onnx_mlp(repo, "ort_gpu")
    config = repo / "ort_gpu" / "config.pbtxt"
    config.write_text(config.read_text() + GPU_GROUP)
    server = server_factory(repo=repo, wait_ready=["ort_gpu"])
    x = np.random.default_rng(0).standard_normal((4, 1024)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    got = _infer(server, "ort_gpu", {"X": x}, "FP32").as_numpy("Y")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@requires_gpu
def test_torchscript_on_cuda(server_factory, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    repo = tmp_path / "models"
    module = fm.torch_modules()["MLP"]()
    config = fm.config_pbtxt("pt_gpu", "pytorch", [("INPUT__0", "FP32", [1024])], [("OUTPUT__0", "FP32", [16])],
                             max_batch_size=8, extra=GPU_GROUP)
    fm.torch_save(repo, "pt_gpu", module, config)
    server = server_factory(repo=repo, wait_ready=["pt_gpu"])
    x = np.random.default_rng(1).standard_normal((2, 1024)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    got = _infer(server, "pt_gpu", {"INPUT__0": x}, "FP32").as_numpy("OUTPUT__0")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def _build_engine(onnx_path, plan_path) -> None:
    trt = pytest.importorskip("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        profile.set_shape(name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    plan_path.write_bytes(bytes(plan))


@requires_gpu
def test_tensorrt_engine_built_in_the_test(server_factory, tmp_path):
    pytest.importorskip("tensorrt")
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA (the tensorrt backend uses torch CUDA buffers)")
    scratch = tmp_path / "scratch"
    onnx_path = fm.onnx_add_sub(scratch, "src", "FP32", batch=True, config=False)
    repo = tmp_path / "models"
    (repo / "trt_add_sub" / "1").mkdir(parents=True)
    _build_engine(onnx_path, repo / "trt_add_sub" / "1" / "model.plan")
    server = server_factory(repo=repo, wait_ready=["trt_add_sub"])  # no config.pbtxt: auto-complete
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    result = _infer(server, "trt_add_sub", {"INPUT0": a, "INPUT1": a}, "FP32")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 0)

