"""A 64 MiB FP32 input to a Python identity model on the GPU, three ways, per request (issue 22):

- cuda shm: the input already sits in a client CUDA region (tritonclient.utils.cuda_shared_memory); the
  worker gets it on the device by IPC handle, no host round trip;
- system shm: the input in a client POSIX shm region (tritonclient.utils.shared_memory);
- body: the input as binary data in the HTTP request body (or gRPC raw_input_contents).

Two shapes: `input` (the model answers 8 bytes: the input's size, so only the input path is timed) and
`roundtrip` (the identity output goes back the same way: into a CUDA region, a system region, the body).
Each point: warm-up, then --n requests one after another; median and mean milliseconds, GB/s of the input.

    .venv/bin/python bench/gpu_cuda_shm.py [--protocol http|grpc] [--n 10] [--mib 64] [--json]

Needs an NVIDIA GPU, cuda-python (tritonclient's cuda_shared_memory) and the server's venv.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                size = pb_utils.Tensor("NBYTES", np.array([int(np.prod(x.shape())) * 4], dtype=np.int64))
                on_gpu = pb_utils.Tensor("ON_GPU", np.array([not x.is_cpu()], dtype=np.bool_))
                outs = [size, on_gpu]
                if "OUTPUT0" in request.requested_output_names():
                    outs.append(pb_utils.Tensor.from_dlpack("OUTPUT0", x))
                responses.append(pb_utils.InferenceResponse(outs))
            return responses
''')
CONFIG = textwrap.dedent('''
    name: "ident_gpu"
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "NBYTES" data_type: TYPE_INT64 dims: [ 1 ] },
             { name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] } ]
    instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
    parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
''')


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(repo: Path) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = repo.parent / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "inferd"), "--model-repository", str(repo), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--allow-client-shm", "true"],
            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/ident_gpu/ready", timeout=1).status == 200:
                return server, http, grpc, log
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit(f"server did not get ready; log in {log}")
        time.sleep(0.2)


def run(args: argparse.Namespace, http: int, grpc: int) -> list[dict[str, Any]]:
    import tritonclient.utils.cuda_shared_memory as cudashm
    import tritonclient.utils.shared_memory as sysshm

    if args.protocol == "grpc":
        import tritonclient.grpc as mod
        client: Any = mod.InferenceServerClient(f"127.0.0.1:{grpc}")
    else:
        import tritonclient.http as mod  # type: ignore[no-redef]
        client = mod.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=300)
    n = args.mib * (1 << 20) // 4
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    nbytes = x.nbytes
    c_in = cudashm.create_shared_memory_region("bench_c_in", nbytes, 0)
    c_out = cudashm.create_shared_memory_region("bench_c_out", nbytes + 64, 0)
    cudashm.set_shared_memory_region(c_in, [x])
    s_in = sysshm.create_shared_memory_region("bench_s_in", "/inferd_bench_s_in", nbytes)
    s_out = sysshm.create_shared_memory_region("bench_s_out", "/inferd_bench_s_out", nbytes + 64)
    sysshm.set_shared_memory_region(s_in, [x])
    client.register_cuda_shared_memory("c_in", cudashm.get_raw_handle(c_in), 0, nbytes)
    client.register_cuda_shared_memory("c_out", cudashm.get_raw_handle(c_out), 0, nbytes + 64)
    client.register_system_shared_memory("s_in", "/inferd_bench_s_in", nbytes)
    client.register_system_shared_memory("s_out", "/inferd_bench_s_out", nbytes + 64)

    def request(way: str, roundtrip: bool) -> tuple[list[Any], list[Any]]:
        inp = mod.InferInput("INPUT0", [n], "FP32")
        if way == "body":
            inp.set_data_from_numpy(x)
        else:
            inp.set_shared_memory("c_in" if way == "cuda shm" else "s_in", nbytes)
        kw = {} if args.protocol == "grpc" else {"binary_data": True}
        names = ["NBYTES", "ON_GPU"] + (["OUTPUT0"] if roundtrip else [])
        outs = [mod.InferRequestedOutput(name, **kw) for name in names]
        if roundtrip and way != "body":
            # every output in the region (then a GPU model's output goes device to device for cuda shm)
            region = "c_out" if way == "cuda shm" else "s_out"
            for out, (offset, size) in zip(outs, [(nbytes, 8), (nbytes + 8, 1), (0, nbytes)]):
                out.set_shared_memory(region, size, offset)
        return [inp], outs

    def probe(way: str) -> bool:
        """The model got the input on the GPU (and saw all of it)."""
        inputs, _ = request(way, False)
        first = client.infer("ident_gpu", inputs, outputs=[mod.InferRequestedOutput("NBYTES"),
                                                           mod.InferRequestedOutput("ON_GPU")])
        assert int(first.as_numpy("NBYTES")[0]) == nbytes
        return bool(first.as_numpy("ON_GPU")[0])

    rows = []
    try:
        for shape in ("input", "roundtrip"):
            for way in ("cuda shm", "system shm", "body"):
                on_gpu = probe(way)
                inputs, outputs = request(way, shape == "roundtrip")
                for _ in range(3):
                    client.infer("ident_gpu", inputs, outputs=outputs)
                if shape == "roundtrip" and way == "cuda shm":
                    got = cudashm.get_contents_as_numpy(c_out, np.float32, [n])
                    assert np.array_equal(got, x), "the identity output in the CUDA region differs"
                samples = []
                for _ in range(args.n):
                    t = time.perf_counter()
                    client.infer("ident_gpu", inputs, outputs=outputs)
                    samples.append(time.perf_counter() - t)
                p50 = statistics.median(samples)
                rows.append({"shape": shape, "way": way, "protocol": args.protocol, "mib": args.mib, "n": args.n,
                             "p50_ms": p50 * 1e3, "mean_ms": statistics.fmean(samples) * 1e3,
                             "gbps": nbytes / p50 / 1e9, "input_on_gpu_in_model": on_gpu})
    finally:
        client.unregister_cuda_shared_memory()
        client.unregister_system_shared_memory()
        for h in (c_in, c_out):
            cudashm.destroy_shared_memory_region(h)
        for h in (s_in, s_out):
            sysshm.destroy_shared_memory_region(h)
        client.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", default="http", choices=["http", "grpc"])
    ap.add_argument("--n", type=int, default=10, help="timed requests per point")
    ap.add_argument("--mib", type=int, default=64, help="input size in MiB")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="inferd-cudashm-bench-")) / "models"
    (repo / "ident_gpu" / "1").mkdir(parents=True)
    (repo / "ident_gpu" / "config.pbtxt").write_text(CONFIG)
    (repo / "ident_gpu" / "1" / "model.py").write_text(MODEL)
    server, http, grpc, log = start_server(repo)
    try:
        rows = run(args, http, grpc)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    gpu = gpu_name()
    if args.json:
        print(json.dumps({"gpu": gpu, "mib": args.mib, "protocol": args.protocol, "n": args.n,
                          "server_log": str(log), "rows": rows}, indent=1))
        return
    print(f"{args.mib} MiB FP32 input, Python identity model on GPU 0 ({gpu}), {args.protocol}, "
          f"{args.n} requests per point")
    print(f"{'shape':10} {'way':11} {'p50 ms':>9} {'mean ms':>9} {'GB/s':>7}  model saw input on GPU")
    for r in rows:
        print(f"{r['shape']:10} {r['way']:11} {r['p50_ms']:9.2f} {r['mean_ms']:9.2f} {r['gbps']:7.2f}  "
              f"{r['input_on_gpu_in_model']}")


if __name__ == "__main__":
    main()
