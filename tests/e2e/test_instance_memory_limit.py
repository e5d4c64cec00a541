"""Memory caps per instance (issue 41 item 1) through a real server: --instance-memory-limit as the default,
a model's INFERD_INSTANCE_MEMORY_LIMIT parameter over it; a model leaking past its cap is replaced and the
next request succeeds, the restart shows with reason "memory" in /metrics and `infer-ctl status`; a model under
its cap is untouched. The parameter keeps the config valid for Triton (Triton ignores unknown parameters):
the first test runs against Triton 2.51 too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import http_get
from tritonclient.utils import InferenceServerException

MiB = 1 << 20

# INPUT0[0] = MiB allocated, touched and kept by the model (a leak); OUTPUT0 echoes INPUT0
LEAK = '''
import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            KEPT.append(np.ones(int(x.reshape(-1)[0]) << 20, dtype=np.uint8))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''

CONFIG = '''name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
%s
'''


def add_model(repo: Path, name: str, limit: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(LEAK)
    param = ('parameters { key: "INFERD_INSTANCE_MEMORY_LIMIT" value: { string_value: "%s" } }' % limit
             if limit is not None else "")
    (repo / name / "config.pbtxt").write_text(CONFIG % (name, param))


def infer(client: httpclient.InferenceServerClient, model: str, mib: float) -> np.ndarray:
    data = np.array([mib], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def restarts_metric(server, model: str, reason: str) -> int:
    code, body = http_get(server.metrics_url)
    assert code == 200
    (inst,) = server.instances(model)
    pattern = (rf'^inferd_instance_restarts_total\{{instance="{inst["name"]}",model="{model}",reason="{reason}",'
               rf'version="1"\}} (\d+)$')
    found = re.search(pattern, body.decode(), re.MULTILINE)
    assert found, body.decode()
    return int(found.group(1))


def ctl_status(server, model: str) -> str:
    done = subprocess.run([sys.executable, "-m", "inferd.supervisor.ctl.main", "--url", server.http_base, "status",
                           model], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_parameter_keeps_the_config_loadable(server_factory, tmp_path):
    """Triton ignores the parameter; inferd caps the instance and says so in its status."""
    repo = tmp_path / "models"
    repo.mkdir()
    add_model(repo, "capped", "300M")
    server = server_factory(repo=repo, models=["capped"])
    client = httpclient.InferenceServerClient(server.http_url)
    assert infer(client, "capped", 1).tolist() == [1.0]
    if server.argv[0] != "bash":  # inferd (tests/tools/triton_reference.sh runs Triton)
        assert [i["memory_limit"] for i in server.instances("capped")] == [300 * MiB]


@pytest.mark.inferd_only
def test_a_leak_past_the_default_cap_is_replaced_and_a_roomier_model_is_not(server_factory, tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    add_model(repo, "leak")  # the server's default: 200 MiB
    add_model(repo, "roomy", "600M")  # the parameter overrides it
    add_model(repo, "free", "none")  # and can lift it
    add_model(repo, "malformed", "lots")
    server = server_factory(repo=repo, models=["leak", "roomy", "free", "malformed"],
                            wait_ready=["leak", "roomy", "free"], inferd_args=["--instance-memory-limit", "200M"])
    client = httpclient.InferenceServerClient(server.http_url)
    first = server.instances("leak")[0]["pid"]
    for model in ("roomy", "free"):  # 300 MiB kept: past the default, below their own caps
        pid = server.instances(model)[0]["pid"]
        for _ in range(6):
            infer(client, model, 50)
        assert [(i["pid"], i["restarts"], i["state"]) for i in server.instances(model)] == [(pid, 0, "ready")]
    assert [i["memory_limit"] for i in server.instances("roomy")] == [600 * MiB]
    assert [i["memory_limit"] for i in server.instances("free")] == [None]
    failed = []
    for _ in range(8):  # 50 MiB kept per request: the default cap is past within 4
        try:
            infer(client, "leak", 50)
        except InferenceServerException as exc:  # the watchdog saw it mid-batch, or the worker is being replaced
            failed.append(str(exc))
        if server.instances("leak")[0]["pid"] != first or failed:
            break
    server.wait_model_ready("leak", timeout=30)
    assert infer(client, "leak", 1).tolist() == [1.0]  # the replacement serves
    (inst,) = server.instances("leak")
    assert inst["pid"] != first and inst["restarts"] == 1 and inst["restart_reasons"]["memory"] == 1
    cap_error = rf"model 'leak' instance '{inst['name']}' exceeded its memory limit of 200 MiB \(RSS \d+ MiB\); killed"
    assert re.match(cap_error, inst["last_error"]), inst["last_error"]
    assert all("exceeded its memory limit of 200 MiB" in f or "not ready" in f for f in failed), failed
    assert restarts_metric(server, "leak", "memory") == 1
    assert restarts_metric(server, "leak", "exit") == 0 and restarts_metric(server, "roomy", "memory") == 0
    text = ctl_status(server, "leak")
    assert "1 (memory 1)" in text and "200 MiB" in text and "exceeded its memory limit of 200 MiB" in text, text
    code, body = server.get("/v2/models/malformed/ready")
    assert code != 200
    index = server.post("/v2/repository/index")[1].decode()
    assert "parameter INFERD_INSTANCE_MEMORY_LIMIT: 'lots' is not a memory size" in index, index


@pytest.mark.inferd_only
def test_a_malformed_server_default_is_refused_by_name(tmp_path):
    done = subprocess.run([sys.executable, "-m", "inferd.supervisor.main", "--model-repository", str(tmp_path),
                           "--instance-memory-limit", "12X"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode != 0
    assert "--instance-memory-limit: '12X' is not a memory size" in done.stderr, done.stderr
