"""A server on made-up GPUs (INFERD_TEST_ONLY_FAKE_GPUS, read by flags.py, for tests only): a model
listing a GPU that does not exist is UNAVAILABLE with a reason naming it, a KIND_GPU Python model's
initialize gets model_instance_kind GPU and its device id, the nv_gpu_* metrics come from the (fake)
NVML and refresh every --metrics-interval-ms, and --allow-gpu-metrics=false or an NVML that fails to
start exports none, saying so once in the log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.inferd_only

ARGS_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = json.dumps({k: args[k] for k in ("model_instance_kind", "model_instance_device_id",
                                                      "model_instance_name")})

    def execute(self, requests):
        out = np.array([self.seen.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
'''
IO = '''backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def _model(repo: Path, name: str, groups: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(ARGS_MODEL)
    (repo / name / "config.pbtxt").write_text(IO + groups)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    _model(repo, "on_cpu", "instance_group [ { kind: KIND_CPU } ]")
    _model(repo, "on_gpu1", "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 1 ] } ]")
    _model(repo, "on_gpu5", "instance_group [ { kind: KIND_GPU gpus: [ 0, 5 ] } ]")
    return repo


def _seen(server, model: str) -> dict:
    import tritonclient.http as httpclient

    client = server.http_client()
    try:
        inp = httpclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.zeros(1, np.float32))
        return json.loads(client.infer(model, [inp]).as_numpy("OUT")[0])
    finally:
        client.close()


def _index(server) -> list[dict]:
    status, body = server.post("/v2/repository/index", b"{}")
    assert status == 200, body
    return json.loads(body)


def _gpu_lines(metrics: str, name: str) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
            if line.startswith(name + "{")}


def test_fake_gpus_placement_and_metrics(server_factory, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFERD_TEST_ONLY_FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = server_factory(repo=_repo(tmp_path), wait_ready=["on_cpu", "on_gpu1"],
                            extra_args=["--metrics-interval-ms", "50"])
    # a listed GPU that does not exist: UNAVAILABLE, the reason names it
    entry = server.wait_until(lambda: next((m for m in _index(server) if m["name"] == "on_gpu5"
                                            and m.get("state") == "UNAVAILABLE"), None), 60, "on_gpu5 refused")
    assert "gpu id 5" in entry["reason"] and "GPUs available: 0 1" in entry["reason"], entry
    assert not server.model_ready("on_gpu5")
    # initialize(args) as Triton's: the instance's kind and device
    assert _seen(server, "on_gpu1") == {"model_instance_kind": "GPU", "model_instance_device_id": "1",
                                        "model_instance_name": "on_gpu1_0_0"}
    assert _seen(server, "on_cpu")["model_instance_kind"] == "CPU"
    # the worker says why it could not make the (fake) device current, and initialize still ran
    assert "CUDA device 1 was not made current before initialize" in server.log()
    # nv_gpu_* from the fake NVML, one series per GPU, refreshed every interval
    uuids = ["GPU-fa6e0000-0000-0000-0000-000000000000", "GPU-fa6e0000-0000-0000-0000-000000000001"]
    first = server.wait_until(lambda: _gpu_lines(server.metrics(), "nv_gpu_utilization") or None, 30, "GPU metrics")
    assert sorted(first) == [f'nv_gpu_utilization{{gpu_uuid="{u}"}}' for u in uuids]
    text = server.metrics()
    for name in ("nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
                 "nv_gpu_power_limit", "nv_energy_consumption"):
        assert len(_gpu_lines(text, name)) == 2, name
    assert "# TYPE nv_energy_consumption counter" in text
    total = _gpu_lines(text, "nv_gpu_memory_total_bytes")
    assert total[f'nv_gpu_memory_total_bytes{{gpu_uuid="{uuids[0]}"}}'] == 16 << 30
    assert _gpu_lines(text, "nv_gpu_power_limit")[f'nv_gpu_power_limit{{gpu_uuid="{uuids[1]}"}}'] == 300.0
    server.wait_until(lambda: _gpu_lines(server.metrics(), "nv_gpu_memory_used_bytes")
                      != _gpu_lines(text, "nv_gpu_memory_used_bytes"), 30, "GPU metrics refreshed")
    log = server.log()
    assert "GPUs: 0: Fake GPU" in log and log.count("GPU metrics: collecting for GPU") == 2


def test_no_gpu_metrics_when_off_or_without_nvml(server_factory, tmp_path, monkeypatch) -> None:
    repo = tmp_path / "models"
    _model(repo, "auto", "")  # KIND_AUTO: CPU without GPUs
    monkeypatch.setenv("INFERD_TEST_ONLY_FAKE_GPUS", "error")
    server = server_factory(repo=repo, wait_ready=["auto"])
    assert _seen(server, "auto")["model_instance_kind"] == "CPU"
    assert "nv_gpu_" not in server.metrics() and "nv_energy_consumption" not in server.metrics()
    log = server.log()
    assert log.count("no GPUs: NVML failed to start") == 1, log
    assert "models run on CPUs; no GPU metrics are exported" in log
    server.stop()
    monkeypatch.setenv("INFERD_TEST_ONLY_FAKE_GPUS", "2")
    repo2 = tmp_path / "models2"
    _model(repo2, "cpu", "instance_group [ { kind: KIND_CPU } ]")
    server = server_factory(repo=repo2, wait_ready=["cpu"], extra_args=["--allow-gpu-metrics=false"])
    assert "nv_gpu_" not in server.metrics() and "nv_energy_consumption" not in server.metrics()
    assert "GPUs: 0: Fake GPU" in server.log()
