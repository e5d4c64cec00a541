"""CPU placement (issue 41 item 3): a worker runs on its host policy's CPUs and its thread pools follow them.

Real servers, real workers: a Python model reports what its worker process sees (os.sched_getaffinity(0),
the BLAS/OpenMP thread variables, and OpenBLAS's own thread count as numpy loaded it); an ONNX model's
worker is counted in threads (ONNX Runtime's intra-op pool: one thread per extra CPU it is sized for).
- a policy of fewer CPUs than the host: affinity = the policy, every variable = its CPU count;
- no policy and the host's every CPU: nothing set (the libraries' defaults);
- no policy but a server started on fewer CPUs (taskset, cpuset): the same as a policy of those CPUs;
- a variable the user set (the server's environment) is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

pytestmark = [pytest.mark.inferd_only,  # Triton pins its stubs but sets none of these (nor reports pids here)
              pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not {0, 1} <= os.sched_getaffinity(0)
                                 or os.cpu_count() is None, reason="needs CPUs 0 and 1 and sched_getaffinity")]

VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")

REPORTER = '''
import ctypes
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

VARS = %r


def openblas_threads():
    """OpenBLAS's thread count as numpy's bundled library has it (None where it cannot be found)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    for path in paths:
        lib = ctypes.CDLL(path)
        for symbol in ("openblas_get_num_threads64_", "scipy_openblas_get_num_threads64_",
                       "openblas_get_num_threads", "scipy_openblas_get_num_threads"):
            if hasattr(lib, symbol):
                return int(getattr(lib, symbol)())
    return None


class TritonPythonModel:
    def execute(self, requests):
        np.dot(np.ones((64, 64)), np.ones((64, 64)))  # BLAS loaded and used
        report = {"cpus": sorted(os.sched_getaffinity(0)), "env": {k: os.environ.get(k) for k in VARS},
                  "openblas": openblas_threads()}
        out = np.array([json.dumps(report).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", out)]) for _ in requests]
''' % (VARS,)

CONFIG = '''name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
%s
'''


def add_reporter(repo: Path, name: str, group: str = "instance_group [ { count: 1, kind: KIND_CPU } ]") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG % (name, group))
    (repo / name / "1" / "model.py").write_text(REPORTER)


def report(server, model: str) -> dict:
    client = server.http_client()
    inp = httpclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return json.loads(client.infer(model, [inp]).as_numpy("REPORT")[0])


def test_the_policys_cpus_size_the_thread_pools(server_factory, tmp_path, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    repo = tmp_path / "models"
    add_reporter(repo, "on_one")  # KIND_CPU: policy "cpu"
    add_reporter(repo, "on_two", 'instance_group [ { count: 1, kind: KIND_CPU, host_policy: "two" } ]')
    add_reporter(repo, "free", 'instance_group [ { count: 1, kind: KIND_CPU, host_policy: "nobody" } ]')
    server = server_factory(repo=repo, models=["on_one", "on_two", "free"],
                            extra_args=["--host-policy", "cpu,cpu-cores=0-0", "--host-policy", "two,cpu-cores=0-1"])
    one = report(server, "on_one")
    assert one["cpus"] == [0]
    assert one["env"] == {name: "1" for name in VARS}
    if one["openblas"] is not None:
        assert one["openblas"] == 1
    two = report(server, "on_two")
    assert two["cpus"] == [0, 1]
    host = os.cpu_count()
    assert two["env"] == {name: ("2" if host > 2 else None) for name in VARS}
    free = report(server, "free")  # no such policy: the server's CPUs
    assert free["cpus"] == sorted(os.sched_getaffinity(0))
    expect = str(len(free["cpus"])) if len(free["cpus"]) < host else None
    assert free["env"] == {name: expect for name in VARS}


def test_a_variable_the_user_set_is_kept(server_factory, tmp_path, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the server's environment: the workers inherit it
    repo = tmp_path / "models"
    add_reporter(repo, "on_one")
    server = server_factory(repo=repo, models=["on_one"], extra_args=["--host-policy", "cpu,cpu-cores=1-1"])
    got = report(server, "on_one")
    assert got["cpus"] == [1]
    assert got["env"] == {**{name: "1" for name in VARS}, "OMP_NUM_THREADS": "3"}


def test_a_server_on_fewer_cpus_than_the_host_sizes_them_without_a_policy(server_factory, tmp_path, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    repo = tmp_path / "models"
    add_reporter(repo, "plain")
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})  # as `taskset -c 1 inferd ...`: the server (and its workers) inherit it
    try:
        server = server_factory(repo=repo, models=["plain"])
    finally:
        os.sched_setaffinity(0, mine)
    got = report(server, "plain")
    assert got["cpus"] == [1]
    assert got["env"] == {name: "1" for name in VARS}


def _threads(server, model: str) -> int:
    (inst,) = server.instances(model)
    return psutil.Process(inst["pid"]).num_threads()


def test_onnx_runtimes_intra_op_pool_follows_the_cpus(server_factory, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import framework_models as fm  # (tests/ is on sys.path through the root conftest)

    repo = tmp_path / "models"
    repo.mkdir()
    one = "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    fm.onnx_add_sub(repo, "ort_auto", extra_config=one)
    fm.onnx_add_sub(repo, "ort_two", extra_config=one + 'parameters { key: "intra_op_thread_count" '
                                                         'value: { string_value: "2" } }')
    server = server_factory(repo=repo, models=["ort_auto", "ort_two"],
                            extra_args=["--host-policy", "cpu,cpu-cores=0-0"])
    auto, two = _threads(server, "ort_auto"), _threads(server, "ort_two")
    # the same worker but for the pool: 1 CPU -> 1 intra-op thread (the caller's), the model's 2 -> one more
    assert two == auto + 1, (auto, two)
