"""A 256 MiB device tensor from one worker to another through BLS: by CUDA IPC handle (the device
path) against the same tensor through host memory (the producer copies it to the host, it travels in
shared memory, the consumer copies it back to its GPU). Issue 21 targets: the device path >= 10x faster
than the host path, and under 1 ms per hand-over once the handle is cached.

The consumer model times each hand-over itself, from just before its BLS `exec()` until the tensor is
usable on its GPU as a torch tensor (device path: opened in place; host path: after `.cuda()` and a
synchronize). The producer returns one persistent tensor (its memory, hence its IPC handle, is the
same every time: a pool's segment reused), so after the first call the consumer's handle is cached.

    python bench/gpu_ipc.py [--mib 256] [--iterations 30] [--json]

Needs an NVIDIA GPU, torch with CUDA, and the `inferd` console script next to this Python.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

GPU_GROUP = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"

PRODUCER = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.host = args["model_name"].endswith("_host")
        self.y = None

    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            if self.y is None or self.y.numel() != n:
                self.y = torch.full((n,), 1.5, dtype=torch.float32, device="cuda:0")
            if self.host:  # the host path: device -> host here, host -> device in the consumer
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", self.y.cpu().numpy())]))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", self.y)]))
        return out
'''

CONSUMER = '''
import time
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            source = "producer_host" if int(pb_utils.get_input_tensor_by_name(request, "HOST").as_numpy()[0]) \\
                else "producer_device"
            t0 = time.perf_counter()
            reply = pb_utils.InferenceRequest(model_name=source, requested_output_names=["Y"], inputs=[n]).exec()
            if reply.has_error():
                raise RuntimeError(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "Y")
            t = torch.from_dlpack(y.to_dlpack())
            if not t.is_cuda:
                t = t.to("cuda:0")
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            ok = bool(t[-1].item() == 1.5)
            del t, y, reply
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SECONDS", np.array([elapsed], np.float64)),
                pb_utils.Tensor("OK", np.array([int(ok)], np.int64))]))
        return out
'''


def _write(repo: Path) -> None:
    io_n = 'input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
    for name in ("producer_device", "producer_host"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(PRODUCER)
        (repo / name / "config.pbtxt").write_text(
            'name: "%s"\nbackend: "python"\n' % name + io_n
            + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n' + GPU_GROUP)
    (repo / "consumer" / "1").mkdir(parents=True)
    (repo / "consumer" / "1" / "model.py").write_text(CONSUMER)
    (repo / "consumer" / "config.pbtxt").write_text(
        'name: "consumer"\nbackend: "python"\n'
        'input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] },\n'
        '        { name: "HOST" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "SECONDS" data_type: TYPE_FP64 dims: [ 1 ] },\n'
        '         { name: "OK" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        + GPU_GROUP)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="tensor size in MiB (default 256)")
    ap.add_argument("--iterations", type=int, default=30, help="timed hand-overs per path (default 30)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()

    import tritonclient.http as httpclient

    work = Path(tempfile.mkdtemp(prefix="inferd-gpu-ipc-"))
    repo = work / "models"
    _write(repo)
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = open(work / "server.log", "wb")  # noqa: SIM115  (closed below)
    server = subprocess.Popen([str(Path(sys.executable).parent / "inferd"), "--model-repository", str(repo),
                               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        ready = "http://127.0.0.1:%d/v2/models/consumer/ready" % http
        while True:
            try:
                if urllib.request.urlopen(ready, timeout=1).status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                print("server did not get ready; log: %s" % (work / "server.log"), file=sys.stderr)
                return 1
            time.sleep(0.2)
        client = httpclient.InferenceServerClient("127.0.0.1:%d" % http, network_timeout=300.0)
        n = np.array([args.mib * (1 << 20) // 4], np.int64)

        def hand_over(host: bool) -> float:
            inputs = [httpclient.InferInput("N", [1], "INT64"), httpclient.InferInput("HOST", [1], "INT64")]
            inputs[0].set_data_from_numpy(n)
            inputs[1].set_data_from_numpy(np.array([int(host)], np.int64))
            result = client.infer("consumer", inputs)
            if int(result.as_numpy("OK")[0]) != 1:
                raise SystemExit("the consumer saw wrong values")
            return float(result.as_numpy("SECONDS")[0])

        first = {"device": hand_over(False), "host": hand_over(True)}  # handle opened, kernels loaded
        samples: dict[str, list[float]] = {"device": [], "host": []}
        for _ in range(args.iterations):  # interleaved: drift hits both paths alike
            samples["device"].append(hand_over(False))
            samples["host"].append(hand_over(True))
        client.close()
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    stats = {}
    for path, values in samples.items():
        ordered = sorted(values)
        stats[path] = {"first_ms": first[path] * 1e3, "mean_ms": statistics.fmean(values) * 1e3,
                       "p50_ms": ordered[len(ordered) // 2] * 1e3, "min_ms": ordered[0] * 1e3,
                       "p90_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1e3}
    speedup = stats["host"]["p50_ms"] / stats["device"]["p50_ms"]
    result = {"gpu": _gpu_name(), "mib": args.mib, "iterations": args.iterations, "paths": stats,
              "speedup_p50": speedup,
              "target_speedup_met": speedup >= 10.0, "target_under_1ms_met": stats["device"]["p50_ms"] < 1.0}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("BLS hand-over of a %d MiB device tensor between two GPU workers on %s (%d iterations, warm)"
          % (args.mib, result["gpu"], args.iterations))
    print("| path | first ms | mean ms | p50 ms | p90 ms | min ms |")
    print("|---|---|---|---|---|---|")
    for path, label in (("device", "CUDA IPC handle"), ("host", "through host memory")):
        s = stats[path]
        print("| %s | %.2f | %.3f | %.3f | %.3f | %.3f |" % (label, s["first_ms"], s["mean_ms"], s["p50_ms"],
                                                            s["p90_ms"], s["min_ms"]))
    print("speedup (p50): %.1fx (target >= 10x: %s); device p50 %.3f ms (target < 1 ms: %s)" % (
        speedup, "met" if result["target_speedup_met"] else "NOT met", stats["device"]["p50_ms"],
        "met" if result["target_under_1ms_met"] else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
