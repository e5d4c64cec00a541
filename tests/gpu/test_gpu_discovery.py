"""On an NVIDIA GPU (marked `gpu`, run with `make test-gpu`; skipped without one): discovery finds the
GPUs CUDA sees, a KIND_GPU Python model's initialize gets model_instance_kind GPU with its device id and
finds that device current (torch.cuda.current_device()), and the nv_gpu_* metrics are exported and move
under load (utilization above 0, memory used growing)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.inferd_only]


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU on this machine")


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


DEVICE_MODEL = '''
import json
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {k: args[k] for k in ("model_instance_kind", "model_instance_device_id")}
        self.seen["current_at_initialize"] = torch.cuda.current_device()
        self.hold = []

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if mode == 1:  # load: matmuls for a while, and 256 MiB more held each call (up to 2 GiB)
                a = torch.randn(4096, 4096, device="cuda")
                t0 = __import__("time").monotonic()
                while __import__("time").monotonic() - t0 < 0.3:
                    a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize()
                if len(self.hold) < 8:
                    self.hold.append(torch.empty(64 << 20, dtype=torch.float32, device="cuda"))
            seen = dict(self.seen, current_at_execute=torch.cuda.current_device())
            out = np.array([json.dumps(seen).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''
IO = '''backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def _model(repo: Path, name: str, groups: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(DEVICE_MODEL)
    (repo / name / "config.pbtxt").write_text(IO + groups)


def _call(server, model: str, mode: int = 0) -> dict:
    import tritonclient.http as httpclient

    client = server.http_client(network_timeout=120.0)
    try:
        inp = httpclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([mode], np.int32))
        return json.loads(client.infer(model, [inp]).as_numpy("OUT")[0])
    finally:
        client.close()


def _series(text: str, name: str) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith(name + "{")}


@requires_gpu
def test_discovery_finds_the_gpus_cuda_sees() -> None:
    pytest.importorskip("pynvml")
    torch = _cuda_torch()
    from inferd.supervisor import gpus

    found = gpus.discover(gpus.nvml_factory(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    try:
        assert found.gpus, found.note
        assert len(found.gpus) == torch.cuda.device_count(), found.note
        for gpu in found.gpus:
            assert gpu.uuid.startswith("GPU-") and gpu.memory_total_bytes > 0
            props = torch.cuda.get_device_properties(gpu.cuda_id)
            if getattr(props, "uuid", None) is not None and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
                assert gpu.uuid == f"GPU-{props.uuid}"
    finally:
        found.close()


@requires_gpu
def test_kind_gpu_initialize_sees_its_device(server_factory, tmp_path) -> None:
    pytest.importorskip("pynvml")
    torch = _cuda_torch()
    last = torch.cuda.device_count() - 1
    repo = tmp_path / "models"
    _model(repo, "dev_first", "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]")
    _model(repo, "dev_last", f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {last} ] }} ]")
    server = server_factory(repo=repo, wait_ready=["dev_first", "dev_last"])
    for model, device in (("dev_first", 0), ("dev_last", last)):
        assert _call(server, model) == {"model_instance_kind": "GPU", "model_instance_device_id": str(device),
                                        "current_at_initialize": device, "current_at_execute": device}
    assert "was not made current" not in server.log()


@requires_gpu
def test_gpu_metrics_present_and_moving_under_load(server_factory, tmp_path) -> None:
    pytest.importorskip("pynvml")
    _cuda_torch()
    repo = tmp_path / "models"
    _model(repo, "burn", "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]")
    server = server_factory(repo=repo, wait_ready=["burn"], extra_args=["--metrics-interval-ms", "200"])
    before = server.wait_until(lambda: _series(server.metrics(), "nv_gpu_memory_used_bytes") or None, 30,
                               "nv_gpu_memory_used_bytes")
    text = server.metrics()
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_power_usage",
                 "nv_gpu_power_limit", "nv_energy_consumption"):
        assert _series(text, name), name
    assert all(v > 0 for v in _series(text, "nv_gpu_memory_total_bytes").values())
    stop = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        while not stop.is_set():
            try:
                _call(server, "burn", 1)
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 120
        busy = grown = False
        while time.monotonic() < deadline and not (busy and grown) and not errors:
            text = server.metrics()
            busy = busy or any(v > 0 for v in _series(text, "nv_gpu_utilization").values())
            used = _series(text, "nv_gpu_memory_used_bytes")
            grown = grown or any(used[k] >= before[k] + (256 << 20) for k in before if k in used)
            time.sleep(0.2)
        assert not errors, errors
        assert busy, "nv_gpu_utilization stayed 0 under load"
        assert grown, f"nv_gpu_memory_used_bytes did not grow by 256 MiB: before {before}, now {used}"
        energy = _series(server.metrics(), "nv_energy_consumption")
        assert any(v > 0 for v in energy.values()), energy
    finally:
        stop.set()
        worker.join(timeout=120)
