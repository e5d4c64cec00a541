"""Framework backends: inferd gRPC infer/s vs the same onnxruntime session / TorchScript module called in a
plain Python loop (the floor).

    .venv/bin/python bench/frameworks.py [--seconds 3] [--backends onnxruntime,pytorch] [--server-args "..."]

Models (built on the spot, tests/framework_models.py): add/sub on FP32 [16] (no batching) and an MLP
1024 -> 256 -> 16 with a 1x1024 input (max_batch_size 8, dynamic batching). One instance, one intra-op
thread, on both sides. Overhead per request = 1 / (inferd infer/s at c=1) - floor time per call. Two
clients: h2load (one low-overhead C client, the same pre-serialized ModelInferRequest each time, as in
bench/run.py) and the tritonclient gRPC client, whose own CPU time (~0.3 ms per call) is part of its figure.
"server CPU µs/req" is the user+sys CPU of the supervisor and its workers over the c=1 point, per request:
steadier than throughput on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import framework_models as fm  # noqa: E402

ONE = 'instance_group [ { kind: KIND_CPU count: 1 } ]\nparameters { key: "%s" value: { string_value: "1" } }\n'


def build(repo: Path, backends: list[str]) -> dict[str, dict]:
    cases: dict[str, dict] = {}
    if "onnxruntime" in backends:
        fm.onnx_add_sub(repo, "ort_small", "FP32", extra_config=ONE % "intra_op_thread_count")
        path = fm.onnx_mlp(repo, "ort_mlp")
        cfg = repo / "ort_mlp" / "config.pbtxt"
        cfg.write_text(cfg.read_text() + ONE % "intra_op_thread_count")
        cases["ort_small"] = {"path": repo / "ort_small/1/model.onnx", "inputs": {"INPUT0": (16,), "INPUT1": (16,)}}
        cases["ort_mlp"] = {"path": path, "inputs": {"X": (1, 1024)}}
    if "pytorch" in backends:
        mods = fm.torch_modules()
        extra = ONE % "INTRA_OP_THREAD_COUNT"
        small, mlp = mods["AddSub"](), mods["MLP"]()
        fm.torch_save(repo, "pt_small", small, fm.config_pbtxt(
            "pt_small", "pytorch", [("INPUT__0", "FP32", [16]), ("INPUT__1", "FP32", [16])],
            [("OUTPUT__0", "FP32", [16]), ("OUTPUT__1", "FP32", [16])], extra=extra))
        fm.torch_save(repo, "pt_mlp", mlp, fm.config_pbtxt(
            "pt_mlp", "pytorch", [("INPUT__0", "FP32", [1024])], [("OUTPUT__0", "FP32", [16])], 8,
            "dynamic_batching { }\n" + extra))
        cases["pt_small"] = {"path": repo / "pt_small/1/model.pt", "inputs": {"INPUT__0": (16,), "INPUT__1": (16,)}}
        cases["pt_mlp"] = {"path": repo / "pt_mlp/1/model.pt", "inputs": {"INPUT__0": (1, 1024)}}
    return cases


def feeds(case: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in case["inputs"].items()}


def floor(name: str, case: dict, seconds: float) -> float:
    """Seconds per call of the framework itself in a plain loop."""
    x = feeds(case)
    if name.startswith("ort"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(case["path"]), options, providers=["CPUExecutionProvider"])

        def call() -> None:
            sess.run(None, x)
    else:
        import torch

        torch.set_num_threads(1)
        module = torch.jit.load(str(case["path"])).eval()
        args = [torch.from_numpy(a) for a in x.values()]

        def call() -> None:
            with torch.inference_mode():
                r = module(*args)
            [t.numpy() for t in (r if isinstance(r, tuple) else (r,))]
    for _ in range(50):
        call()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            call()
        n += 100
    return (time.perf_counter() - t0) / n


def grpc_rate(url: str, name: str, case: dict, concurrency: int, seconds: float) -> tuple[float, int]:
    """(infer/s over the timed part, every request sent, warm-up included)."""
    import tritonclient.grpc as grpcclient

    x = feeds(case)
    counts = [0] * concurrency
    stop = time.perf_counter() + seconds
    start = threading.Barrier(concurrency + 1)

    def worker(i: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        inputs = []
        for n, a in x.items():
            inp = grpcclient.InferInput(n, list(a.shape), "FP32")
            inp.set_data_from_numpy(a)
            inputs.append(inp)
        for _ in range(20):
            client.infer(name, inputs)
        start.wait()
        while time.perf_counter() < stop:
            client.infer(name, inputs)
            counts[i] += 1
        client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    stop = t0 + seconds
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0), sum(counts) + 20 * concurrency


H2_RATE = re.compile(r"finished in [\d.]+\w*, ([\d.]+) req/s")
H2_OK = re.compile(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded")


def h2load_rate(url: str, name: str, case: dict, concurrency: int, seconds: float,
                workdir: Path) -> tuple[float, int]:
    """(infer/s, requests done) of h2load sending one pre-serialized ModelInferRequest, `concurrency`
    connections."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=name)
    for n, a in feeds(case).items():
        t = req.inputs.add(name=n, datatype="FP32", shape=list(a.shape))
        del t  # the tensor bytes go in raw_input_contents, in input order
        req.raw_input_contents.append(a.tobytes())
    body = req.SerializeToString()
    path = workdir / f"{name}.grpc"
    path.write_bytes(struct.pack(">BI", 0, len(body)) + body)
    argv = ["h2load", "-t1", f"-c{concurrency}", "-m1", "-D", str(max(1, round(seconds))),
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(path),
            f"http://{url}/inference.GRPCInferenceService/ModelInfer"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    rate, ok = H2_RATE.search(out), H2_OK.search(out)
    if not rate or not ok or ok.group(1) != ok.group(2):
        raise SystemExit(f"h2load failed:\n{out}")
    return float(rate.group(1)), int(ok.group(2))


def server_cpu(pid: int) -> float:
    """User+sys CPU seconds of the server process and its children (the workers)."""
    main = psutil.Process(pid)
    total = sum(main.cpu_times()[:2])
    for child in main.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--backends", default="onnxruntime,pytorch")
    ap.add_argument("--server-args", default="", help="more inferd flags, one string (e.g. \"--busy-poll-us 0\")")
    args = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="inferd-fw-bench-")) / "models"
    cases = build(repo, args.backends.split(","))
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = open(repo.parent / "server.log", "wb")  # noqa: SIM115  (closed in the finally below)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "inferd"), "--model-repository", str(repo), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), *args.server_args.split()],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                ready = all(urllib.request.urlopen("http://127.0.0.1:%d/v2/models/%s/ready" % (http, n),
                                                   timeout=1).status == 200 for n in cases)
                if ready:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("server did not get ready; log in %s" % log.name)
            time.sleep(0.2)
        clients = ["h2load", "tritonclient"] if shutil.which("h2load") else ["tritonclient"]
        print("| model | client | floor µs/call | c=1 infer/s | c=1 µs/req | overhead µs | ratio "
              "| server CPU µs/req (c=1) | c=8 infer/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        url = "127.0.0.1:%d" % grpc
        for name, case in cases.items():
            f = floor(name, case, args.seconds)
            for client in clients:
                cpu0 = server_cpu(server.pid)
                if client == "h2load":
                    r1, n1 = h2load_rate(url, name, case, 1, args.seconds, repo.parent)
                else:
                    r1, n1 = grpc_rate(url, name, case, 1, args.seconds)
                cpu_per = 1e6 * (server_cpu(server.pid) - cpu0) / max(1, n1)
                r8 = (h2load_rate(url, name, case, 8, args.seconds, repo.parent) if client == "h2load"
                      else grpc_rate(url, name, case, 8, args.seconds))[0]
                per = 1e6 / r1
                print("| %s | %s | %.1f | %.0f | %.0f | %.0f | %.1f× | %.0f | %.0f |"
                      % (name, client, f * 1e6, r1, per, per - f * 1e6, per / (f * 1e6), cpu_per, r8), flush=True)
    finally:
        server.terminate()
        server.wait(15)
        log.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
