"""The Python backend's GPU data path on an NVIDIA GPU (issue 21, items 2-4): device tensors in
pb_utils, device tensors between workers by CUDA IPC (BLS both ways, ensemble steps), a TorchScript
GPU instance fed by a GPU Python model, and kill -9 of a producer whose memory is still referenced.
Marked `gpu` (`make test-gpu`); every test skips cleanly without a GPU or without torch with CUDA."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import gpu_models as gm
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.inferd_only]

MiB = 1 << 20


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def _torch_cuda():
    if not _has_gpu():
        pytest.skip("no NVIDIA GPU on this machine")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def _infer(server, model, arrays, outputs=None):
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    client = server.http_client(network_timeout=120.0)
    try:
        inputs = []
        for name, array in arrays.items():
            inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        wanted = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
        return client.infer(model, inputs, outputs=wanted)
    finally:
        client.close()


def _rss(pid: int) -> int:
    with open("/proc/%d/statm" % pid) as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- pb_utils in this process -------------------------------------------------------------------------

def _pb():
    from inferd.worker.compat import load_pb_utils

    return load_pb_utils()


def test_from_dlpack_to_dlpack_round_trips_torch():
    torch = _torch_cuda()
    pb = _pb()
    for dtype in (torch.float32, torch.float16, torch.int64, torch.bfloat16, torch.bool):
        x = (torch.arange(12, device="cuda:0") % 3).to(dtype).reshape(3, 4)
        t = pb.Tensor.from_dlpack("X", x)
        assert not t.is_cpu() and t.shape() == [3, 4]
        with pytest.raises(pb.TritonModelException):
            t.as_numpy()
        back = torch.from_dlpack(t.to_dlpack())
        assert back.is_cuda and back.dtype == dtype and back.data_ptr() == x.data_ptr()  # shared, not copied
        assert torch.equal(back, x)
    assert pb.Tensor.from_dlpack("B", torch.zeros(2, dtype=torch.bfloat16, device="cuda:0")).triton_dtype() == 14
    with pytest.raises(pb.TritonModelException, match="C-contiguous"):
        pb.Tensor.from_dlpack("T", torch.zeros(4, 4, device="cuda:0").t())


def test_from_dlpack_to_dlpack_round_trips_cupy():
    _torch_cuda()
    cupy = pytest.importorskip("cupy")
    pb = _pb()
    x = cupy.arange(10, dtype=cupy.float32)
    t = pb.Tensor.from_dlpack("X", x)
    assert not t.is_cpu() and t.__dlpack_device__() == (2, 0)
    y = cupy.from_dlpack(t.to_dlpack())
    assert int(y.data.ptr) == int(x.data.ptr) and bool((y == x).all())
    t2 = pb.Tensor.from_dlpack("Y", x.toDlpack())  # a bare CUDA capsule
    assert not t2.is_cpu()
    np.testing.assert_array_equal(t2._array.to_numpy(), np.arange(10, dtype=np.float32))


def test_cuda_ipc_export_open_copy_in_process():
    torch = _torch_cuda()
    from inferd.worker.wire import cuda_ipc

    assert cuda_ipc.available() and cuda_ipc.device_count() >= 1
    x = torch.arange(1024, dtype=torch.float32, device="cuda:0")
    handle, offset = cuda_ipc.export(x[256:].data_ptr(), 0)
    assert len(handle) == 64 and offset >= 1024
    host = np.empty(768, np.float32)
    cuda_ipc.copy(host.ctypes.data, x[256:].data_ptr(), host.nbytes, 0)
    np.testing.assert_array_equal(host, np.arange(256, 1024, dtype=np.float32))


# ---- through the server -------------------------------------------------------------------------------

def test_cuda_torch_python_model_in_and_out(server_factory, tmp_path):
    _torch_cuda()
    repo = tmp_path / "models"
    gm.python_model(repo, "double", gm.DOUBLE, [("X", "FP32", [-1])], [("Y", "FP32", [-1])])
    server = server_factory(repo=repo, wait_ready=["double"])
    x = np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(_infer(server, "double", {"X": x}).as_numpy("Y"), x * 2)


def test_bls_passes_256_mib_device_tensor_without_host_copy(server_factory, tmp_path):
    _torch_cuda()
    repo = gm.bls_repo(tmp_path / "models")
    server = server_factory(repo=repo, wait_ready=["producer", "consumer", "checker"])
    n = np.array([64 * MiB], np.int64)  # 64 Mi float32 = 256 MiB
    _infer(server, "consumer", {"N": n})  # warm-up: CUDA contexts, torch kernels, handle opened
    supervisor_before = _rss(server.pid)
    report = _infer(server, "consumer", {"N": n}).as_numpy("REPORT")
    on_device, right, grown, opened, verdict = (int(v) for v in report)
    assert on_device == 1, "the BLS output did not arrive in device memory"
    assert right == 1, "the device tensor's values are wrong"
    assert verdict == 1, "the second hand-over (a BLS input) did not arrive on the GPU intact"
    assert opened >= 1, "the consumer opened no CUDA IPC handle"
    assert grown < 64 * MiB, "the consumer's host RSS grew by %d MiB" % (grown // MiB)
    assert _rss(server.pid) - supervisor_before < 64 * MiB, "the supervisor's RSS grew: it copied the tensor"


def test_ensemble_of_two_gpu_python_models(server_factory, tmp_path):
    _torch_cuda()
    repo = tmp_path / "models"
    gm.python_model(repo, "double", gm.DOUBLE, [("X", "FP32", [-1])], [("Y", "FP32", [-1])])
    gm.python_model(repo, "plus_one", gm.PLUS_ONE_ON_GPU, [("Y", "FP32", [-1])], [("Z", "FP32", [-1])],
                    gm.DEVICE_INPUTS)
    gm.ensemble(repo, "gpu_pipe", [("X", "FP32", [-1])], [("Z", "FP32", [-1])],
                [("double", {"X": "X"}, {"Y": "y"}), ("plus_one", {"Y": "y"}, {"Z": "Z"})])
    server = server_factory(repo=repo, wait_ready=["gpu_pipe"])
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    for _ in range(3):  # the producer's memory is released and reused between requests
        np.testing.assert_allclose(_infer(server, "gpu_pipe", {"X": x}).as_numpy("Z"), x * 2 + 1, rtol=1e-6)


def test_torchscript_gpu_instance_fed_by_gpu_python_model(server_factory, tmp_path):
    torch = _torch_cuda()
    import framework_models as fm

    repo = tmp_path / "models"
    gm.python_model(repo, "double", gm.DOUBLE, [("X", "FP32", [-1, 1024])], [("Y", "FP32", [-1, 1024])])
    module = fm.torch_modules()["MLP"]()
    fm.torch_save(repo, "mlp_gpu", module, fm.config_pbtxt(
        "mlp_gpu", "pytorch", [("INPUT__0", "FP32", [-1, 1024])], [("OUTPUT__0", "FP32", [-1, 16])],
        extra=gm.GPU_GROUP))
    gm.ensemble(repo, "to_torchscript", [("X", "FP32", [-1, 1024])], [("OUT", "FP32", [-1, 16])],
                [("double", {"X": "X"}, {"Y": "y"}), ("mlp_gpu", {"INPUT__0": "y"}, {"OUTPUT__0": "OUT"})])
    server = server_factory(repo=repo, wait_ready=["to_torchscript"])
    x = np.random.default_rng(2).standard_normal((4, 1024)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x * 2)).numpy()
    got = _infer(server, "to_torchscript", {"X": x}).as_numpy("OUT")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_kill_9_of_producer_fails_the_request_holding_its_memory(server_factory, tmp_path):
    _torch_cuda()
    repo = tmp_path / "models"
    hold = tmp_path / "hold"
    hold.mkdir()
    gm.python_model(repo, "producer", gm.PRODUCER, [("N", "INT64", [1])], [("Y", "FP32", [-1])])
    gm.python_model(repo, "holder", gm.HOLDER, [("Y", "FP32", [-1])], [("Z", "FP32", [1])],
                    gm.DEVICE_INPUTS + 'parameters { key: "hold_dir" value: { string_value: "%s" } }\n' % hold)
    gm.ensemble(repo, "hold_pipe", [("N", "INT64", [1])], [("Z", "FP32", [1])],
                [("producer", {"N": "N"}, {"Y": "y"}), ("holder", {"Y": "y"}, {"Z": "Z"})])
    server = server_factory(repo=repo, wait_ready=["hold_pipe"])
    producer_pid = server.worker_pids("producer")[0]
    holder_pid = server.worker_pids("holder")[0]
    n = np.array([1 * MiB], np.int64)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_infer, server, "hold_pipe", {"N": n})
        deadline = time.monotonic() + 60
        while not (hold / "started").exists():
            assert time.monotonic() < deadline and not pending.done(), "the holder never got the device tensor"
            time.sleep(0.02)
        os.kill(producer_pid, signal.SIGKILL)  # the consumer still holds the producer's IPC handle
        server.wait_until(lambda: producer_pid not in server.worker_pids("producer"), 60, "producer reaped")
        (hold / "go").touch()
        with pytest.raises(Exception) as err:
            pending.result(timeout=120)
    assert "producer" in str(err.value) and "died" in str(err.value)
    assert holder_pid in server.worker_pids("holder"), "the consumer died with the producer"
    server.wait_model_ready("producer", timeout=120)  # restarted
    (hold / "started").unlink()
    assert _infer(server, "hold_pipe", {"N": n}).as_numpy("Z")[0] == 1.0
