"""Worker CPU per small request (slow; run on demand).

Drives a real worker (examples/add_sub: FP32[16] add/sub; or the same on onnxruntime, a model built on
the spot, one intra-op thread) from a raw ZeroMQ ROUTER with Execute headers built the way
`supervisor/instances/packing.py` builds them, one request per batch, in lock step, and reports the
worker's CPU time per request (all threads, and the main thread alone):

    .venv/bin/python -m pytest -q -m slow -s tests/integration/worker/test_bench_worker.py
    .venv/bin/python tests/integration/worker/test_bench_worker.py [N] [python] [python|onnxruntime]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from inferd.worker.wire import messages as m

try:
    from .workerharness import FakeSupervisor
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from workerharness import FakeSupervisor  # type: ignore[no-redef]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")]

ROOT = Path(__file__).resolve().parents[3]
ADD_SUB = ROOT / "examples" / "add_sub"
CONFIG = {
    "name": "add_sub", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    "instance_group": [{"name": "add_sub_0", "kind": "KIND_CPU", "count": 1}],
}


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) per thread id, from /proc (no psutil needed)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _header(batch_id: int, request_id: int) -> bytes:
    ref = {"loc": "frame", "region": "", "offset": 0, "nbytes": 64}
    item = {
        "request_id": request_id, "id": "",
        "inputs": [dict(ref, name="INPUT0", datatype="FP32", shape=[16], frame=0),
                   dict(ref, name="INPUT1", datatype="FP32", shape=[16], frame=1)],
        "requested_outputs": ["OUTPUT0", "OUTPUT1"], "parameters": "{}", "correlation_id": 0,
        "flags": 0, "timeout_us": 0,
    }
    doc = {"batch_id": batch_id, "requests": [item], "forget_regions": [], "t": "execute"}
    return json.dumps(doc, separators=(",", ":")).encode()


def _onnx_add_sub(root: Path) -> tuple[str, dict]:
    """(model directory, config) of add_sub as an ONNX graph (tests/framework_models.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import framework_models as fm

    fm.onnx_add_sub(root, "add_sub", "FP32", config=False)
    config = dict(CONFIG, backend="onnxruntime",
                  parameters={"intra_op_thread_count": {"string_value": "1"}})
    return str(root / "add_sub"), config


def run(n: int = 20000, python: str = sys.executable, warmup: int = 2000, backend: str = "python") -> dict[str, float]:
    sup = FakeSupervisor(python)
    try:
        model_dir, config = str(ADD_SUB), CONFIG
        if backend == "onnxruntime":
            model_dir, config = _onnx_add_sub(sup.dir)
        proc = sup.spawn("bench", hb_interval=0.5, hb_timeout=0.0)
        sup.expect(m.Hello)
        sup.send("bench", m.LoadModel(model_name="add_sub", model_dir=model_dir, version="1",
                                      config_json=json.dumps(config), backend=backend,
                                      instance_name="add_sub_0_0", instance_kind="CPU"))
        loaded, _ = sup.expect(m.LoadResult)
        assert loaded.error is None, loaded.error
        a = np.arange(16, dtype="<f4")
        b = np.ones(16, dtype="<f4")
        router = sup.router
        ident = b"bench"

        def one(i: int) -> None:
            router.send_multipart([ident, _header(i, i), a.data, b.data], copy=False)
            while True:
                parts = router.recv_multipart(copy=False)
                if parts[0].bytes == ident:
                    break
            if i == 0:  # check the answer once
                header = json.loads(parts[1].bytes)
                assert header["t"] == "execute_result" and header["batch_id"] == 0, header
                (item,) = header["responses"]
                assert item.get("error") is None and item["request_id"] == 0, item  # no error: the key is left out
                outs = {o["name"]: np.frombuffer(parts[2 + o["frame"]].buffer, "<f4")[
                    o.get("offset", 0) // 4:(o.get("offset", 0) + o["nbytes"]) // 4] for o in item["outputs"]}
                np.testing.assert_array_equal(outs["OUTPUT0"], a + b)
                np.testing.assert_array_equal(outs["OUTPUT1"], a - b)

        for i in range(warmup):
            one(i)
        before = _thread_cpu(proc.pid)
        t0 = time.perf_counter()
        for i in range(warmup, warmup + n):
            one(i)
        wall = time.perf_counter() - t0
        after = _thread_cpu(proc.pid)
        main = after.get(proc.pid, 0.0) - before.get(proc.pid, 0.0)
        total = sum(after.values()) - sum(before.get(t, 0.0) for t in after)
        sup.send("bench", m.Shutdown())
        sup.expect(m.Bye)
        proc.wait(5)
        return {"n": n, "cpu_us": total / n * 1e6, "main_cpu_us": main / n * 1e6,
                "other_threads_cpu_us": (total - main) / n * 1e6, "round_trip_us": wall / n * 1e6}
    finally:
        sup.close()


def test_worker_cpu_per_small_request() -> None:
    result = run(int(os.environ.get("INFERD_BENCH_N", "20000")))
    print("\nworker add_sub: %s" % json.dumps({k: round(v, 1) for k, v in result.items()}))
    assert result["cpu_us"] > 0


if __name__ == "__main__":
    res = run(int(sys.argv[1]) if len(sys.argv) > 1 else 20000, sys.argv[2] if len(sys.argv) > 2 else sys.executable,
              backend=sys.argv[3] if len(sys.argv) > 3 else "python")
    print(json.dumps({k: round(v, 1) for k, v in res.items()}))
