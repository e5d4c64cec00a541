"""Supervision faults against a real inferd with its default timings (heartbeat 0.5 s x 4 = L 2 s,
restart 0.25 s doubling to 10 s): the figures of docs/reliability.md (issue 18 items 4 and 5).

Cases, one after the other on one server, while a bystander thread keeps calling another model over
HTTP (it must see no error: nothing lost):
- gil_hold_5s: a model holds the GIL for 5 s in one C call: must succeed on the same worker.
- sigstop: a worker SIGSTOPped mid-request: error latency, recovery (new worker ready and serving).
- deadlock: a worker blocked for good holding the GIL (no heartbeat, no CPU): idem.
- poison_x10: ten requests in a row that crash the model, each after it came back and served.
Each row: error latency, recovery time, supervisor CPU and RSS before/after, server /dev/shm entries.

    .venv/bin/python bench/faults.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import ROOT, Server  # noqa: E402  (same server harness)

GIL_CONFIG = """name: "gil"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
GIL_MODEL = '''
import ctypes, itertools, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            v = float(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0])
            if v == -1:
                ctypes.PyDLL(None).pause()  # blocked for good, holding the GIL
            if v == -2:
                time.sleep(3600)  # plain long call (GIL released): for SIGSTOP
            if v > 0:  # CPU in one C call that never releases the GIL
                t0 = time.perf_counter(); sum(itertools.repeat(1, 10 ** 7))
                sum(itertools.repeat(1, int(10 ** 7 / (time.perf_counter() - t0) * v)))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([v], np.float32)),
                                                   pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return out
'''


def make_repo(root: Path) -> Path:
    import shutil

    repo = root / "models"
    (repo / "gil" / "1").mkdir(parents=True)
    (repo / "gil" / "config.pbtxt").write_text(GIL_CONFIG)
    (repo / "gil" / "1" / "model.py").write_text(GIL_MODEL)
    shutil.copytree(ROOT / "tests" / "fixtures" / "models" / "crash", repo / "crash")
    shutil.copytree(ROOT / "examples" / "identity_fp32", repo / "identity_fp32")
    return repo


def status_pid(client: httpclient.InferenceServerClient, model: str) -> tuple[int | None, str, int]:
    body = json.loads(client._get("v2/inferd/status", None, None).read())  # inferd's own status
    for m in body.get("models", []):
        if m.get("name") == model and m.get("instances"):
            i = m["instances"][0]
            return i.get("pid"), str(i.get("state", "")).lower(), int(i.get("restarts", 0))
    return None, "", 0


def infer(client: httpclient.InferenceServerClient, model: str, value: float, dtype: str = "FP32") -> Any:
    inp = httpclient.InferInput("INPUT0", [1], dtype)
    inp.set_data_from_numpy(np.array([value], dtype=np.float32 if dtype == "FP32" else np.int32))
    return client.infer(model, [inp])


def wait_serving(client: httpclient.InferenceServerClient, model: str, old_pid: int | None,
                 dtype: str = "FP32", timeout: float = 60.0) -> float:
    """Seconds until `model` answers from a worker other than old_pid."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pid, state, _ = status_pid(client, model)
        if pid and pid != old_pid and state == "ready":
            try:
                infer(client, model, 0 if dtype == "FP32" else 7, dtype)  # an echo for both models
                return time.monotonic() - t0
            except Exception:
                pass
        time.sleep(0.02)
    raise RuntimeError(f"{model} not serving again within {timeout} s")


def bystander(server: Server, stop: threading.Event, counts: dict[str, int]) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    data = np.arange(256, dtype=np.float32)
    while not stop.is_set():
        try:
            inp = httpclient.InferInput("INPUT0", [256], "FP32")
            inp.set_data_from_numpy(data)
            assert np.array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)
            counts["ok"] += 1
        except Exception:
            counts["errors"] += 1
        time.sleep(0.005)
    client.close()


def fault(server: Server, client: httpclient.InferenceServerClient, model: str, value: float, dtype: str,
          trigger: Any = None) -> dict[str, Any]:
    """Send the poisonous request (and `trigger(pid)` once it runs); error latency and recovery."""
    pid, _, _ = status_pid(client, model)
    result: dict[str, Any] = {}

    def call() -> None:
        t = time.monotonic()
        try:
            infer(client_b, model, value, dtype)
            result["ok"] = True
        except Exception as exc:
            result["error"] = str(exc)[:160]
        result["done"] = time.monotonic()
        result["latency"] = result["done"] - t

    client_b = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    th = threading.Thread(target=call)
    t0 = time.monotonic()
    th.start()
    if trigger is not None:
        time.sleep(0.3)
        t0 = time.monotonic()
        trigger(pid)
    th.join(120)
    client_b.close()
    key = "latency_s" if result.get("ok") else "error_latency_s"
    row = {key: round(result["done"] - t0, 2), "error": result.get("error", "")}
    if "error" in result:
        row["recovery_s"] = round(wait_serving(client, model, pid, dtype), 2)
    else:
        row["ok"] = True
        row["same_worker"] = status_pid(client, model)[0] == pid
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="inferd-faults-"))
    server = Server(make_repo(scratch), scratch / "server.log", control_mode="none")
    rows: dict[str, Any] = {}
    stop = threading.Event()
    counts = {"ok": 0, "errors": 0}
    try:
        server.wait_ready()
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        by = threading.Thread(target=bystander, args=(server, stop, counts), daemon=True)
        by.start()
        cases = [
            ("gil_hold_5s", lambda: fault(server, client, "gil", 5.0, "FP32")),
            ("sigstop", lambda: fault(server, client, "gil", -2, "FP32", lambda p: os.kill(p, signal.SIGSTOP))),
            ("deadlock", lambda: fault(server, client, "gil", -1, "FP32")),
        ]
        for name, run in cases:
            before = server.sample()
            row = run()
            after = server.sample()
            row.update(rss_mib=f"{before['rss_mib']:.1f}->{after['rss_mib']:.1f}",
                       cpu_s=round(after["cpu_s"] - before["cpu_s"], 2), shm=f"{before['shm']}->{after['shm']}")
            rows[name] = row
            print(name, row, file=sys.stderr, flush=True)
        before = server.sample()
        t0 = time.monotonic()
        poison = [fault(server, client, "crash", 3, "INT32") for _ in range(10)]
        after = server.sample()
        rows["poison_x10"] = {
            "total_s": round(time.monotonic() - t0, 1),
            "error_latency_s": max(p["error_latency_s"] for p in poison),
            "recovery_s": [p.get("recovery_s") for p in poison],
            "all_failed_then_served": all("recovery_s" in p for p in poison),
            "restarts": status_pid(client, "crash")[2],
            "rss_mib": f"{before['rss_mib']:.1f}->{after['rss_mib']:.1f}",
            "cpu_s": round(after["cpu_s"] - before["cpu_s"], 2), "shm": f"{before['shm']}->{after['shm']}",
        }
        print("poison_x10", rows["poison_x10"], file=sys.stderr, flush=True)
        stop.set()
        by.join(30)
        rows["bystander"] = dict(counts)
        client.close()
    finally:
        stop.set()
        rc = server.stop()
    rows["exit_code"] = rc
    rows["shm_after_stop"] = len(server.shm_entries())
    print(json.dumps(rows, indent=2) if args.json else rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
