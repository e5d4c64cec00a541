"""A Python model whose shared memory cannot grow (Triton's qa L0_backend_python test_growth_error, here with
a private, small /dev/shm made by `unshare -m`): an input that does not fit gets Triton's answer (500,
"Failed to increase the shared memory pool size"); an output that does not fit still reaches the client
(through the socket instead: better than Triton's error, docs/python-backend.md); the worker never dies, and
the next request is served by the same instance."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import INFERD_BIN, free_ports, wait_for
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.inferd_only
MIB = 1 << 20
MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().copy())]) for r in requests]
"""
CONFIG = """name: "identity_uint8"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def small_shm_server(tmp_path_factory):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare -m as root to give the server a small /dev/shm")
    repo = tmp_path_factory.mktemp("repo")
    (repo / "identity_uint8" / "1").mkdir(parents=True)
    (repo / "identity_uint8" / "1" / "model.py").write_text(MODEL)
    (repo / "identity_uint8" / "config.pbtxt").write_text(CONFIG)
    http, grpc, metrics = free_ports(3)
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")  # noqa: SIM115 - closed at teardown
    script = ('mount -t tmpfs -o size=48m tmpfs /dev/shm && exec "$0" --model-repository "$1" --http-port "$2" '
              '--grpc-port "$3" --metrics-port "$4" --http-address 127.0.0.1 --grpc-address 127.0.0.1 '
              '--metrics-address 127.0.0.1')
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script, str(INFERD_BIN), str(repo), str(http), str(grpc),
                             str(metrics)], stdout=log, stderr=subprocess.STDOUT)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120)

    def ready() -> bool:
        if proc.poll() is not None:
            log.seek(0)
            pytest.skip("cannot start a server with a private /dev/shm here: " + log.read()[-500:])
        try:
            return client.is_model_ready("identity_uint8")
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    wait_for(ready, 60, "the server with a 48 MiB /dev/shm")
    yield client, proc
    client.close()
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _infer(client, mib: int) -> np.ndarray:
    x = (np.arange(mib * MIB) % 251).astype(np.uint8)
    inp = httpclient.InferInput("INPUT0", [x.size], "UINT8")
    inp.set_data_from_numpy(x, binary_data=True)
    out = client.infer("identity_uint8", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    y = out.as_numpy("OUTPUT0")
    assert np.array_equal(x, y)
    return y


def test_growth_error(small_shm_server):
    client, proc = small_shm_server
    _infer(client, 2)
    with pytest.raises(InferenceServerException) as info:  # the input alone does not fit in 48 MiB
        _infer(client, 60)
    assert info.value.status() == "500", info.value
    assert "Failed to increase the shared memory pool size" in str(info.value)
    _infer(client, 20)  # fits as input; the output does not fit beside it: answered by the socket
    _infer(client, 2)
    assert proc.poll() is None
    stats = client.get_inference_statistics("identity_uint8")["model_stats"][0]["inference_stats"]
    assert int(stats["fail"]["count"]) == 1 and int(stats["success"]["count"]) == 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
