"""Python API side by side: inferd.pytriton vs PyTriton 0.7 serving the same bound add_sub function.

    .venv/bin/python bench/pyapi.py                       # 3 runs, 5 s per point
    .venv/bin/python bench/pyapi.py --runs 5 --duration 10 --impls inferd,pytriton

Each run starts one server program per implementation (the same code; only the import prefix differs:
`inferd.pytriton` under this venv's Python, `pytriton` under the Triton reference venv of
/work/shared/tools/triton_reference.sh, which holds nvidia-pytriton 0.7.0), measures its start-up, then
drives it with one load generator (this process, asyncio): HTTP (keep-alive connections, a pre-built JSON
body, every reply's status checked) and gRPC (grpc.aio with a pre-serialized ModelInferRequest, every
reply checked for its two outputs), at concurrency 1 and 16. Programs run one at a time.

Start-up: "in-process" is `Triton()` entered to the model being ready (PyTriton: tritonserver started and
its proxy model loaded; inferd: the supervisor started and the function's worker connected), "wall" adds
the interpreter and the imports (spawn to the READY line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REF_PYTHON = Path(os.environ.get("TRITON_REF_DIR", Path.home() / ".cache/triton-reference")) / "venv/bin/python"
MODEL = "add_sub"
SHAPE = 16

PROGRAM = '''
import sys, time
t_start = time.perf_counter()
import numpy as np
from {p}.decorators import batch
from {p}.model_config import ModelConfig, Tensor
from {p}.triton import Triton, TritonConfig

@batch
def add_sub(INPUT0, INPUT1):
    return {{"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}}

http, grpc, metrics = (int(a) for a in sys.argv[1:4])
t0 = time.perf_counter()
with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
    triton.bind(model_name="add_sub", infer_func=add_sub,
                inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=({n},)),
                        Tensor(name="INPUT1", dtype=np.float32, shape=({n},))],
                outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=({n},)),
                         Tensor(name="OUTPUT1", dtype=np.float32, shape=({n},))],
                config=ModelConfig(max_batch_size=16))
    print("READY %.4f %.4f" % (time.perf_counter() - t0, time.perf_counter() - t_start), flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
'''


def http_body() -> bytes:
    a = np.arange(SHAPE, dtype=np.float32)
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, SHAPE], "datatype": "FP32", "data": a.tolist()},
                      {"name": "INPUT1", "shape": [1, SHAPE], "datatype": "FP32", "data": a.tolist()}]}
    return json.dumps(doc).encode()


def grpc_request() -> bytes:
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=MODEL)
    a = np.arange(SHAPE, dtype=np.float32)
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.extend([1, SHAPE])
        req.raw_input_contents.append(a.tobytes())
    return req.SerializeToString()


async def http_worker(port: int, body: bytes, stop_at: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = ("POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (MODEL, len(body))).encode()
    try:
        while time.perf_counter() < stop_at:
            writer.write(head + body)
            status = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            counts[0 if status.split()[1] == b"200" else 1] += 1
    finally:
        writer.close()


async def grpc_worker(channel, request: bytes, stop_at: float, counts: list[int]) -> None:
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    while time.perf_counter() < stop_at:
        try:
            reply = await call(request, timeout=30)
            counts[0 if len(reply) > 2 * SHAPE * 4 else 1] += 1
        except Exception:  # noqa: BLE001 - an error reply counts as one
            counts[1] += 1


async def drive(protocol: str, port: int, conc: int, duration: float) -> dict:
    counts = [0, 0]
    warm = time.perf_counter() + min(1.0, duration / 5)
    if protocol == "http":
        body = http_body()
        await asyncio.gather(*(http_worker(port, body, warm, [0, 0]) for _ in range(conc)))
        t0 = time.perf_counter()
        await asyncio.gather(*(http_worker(port, body, t0 + duration, counts) for _ in range(conc)))
    else:
        import grpc

        request = grpc_request()
        async with grpc.aio.insecure_channel("127.0.0.1:%d" % port) as channel:
            await asyncio.gather(*(grpc_worker(channel, request, warm, [0, 0]) for _ in range(conc)))
            t0 = time.perf_counter()
            await asyncio.gather(*(grpc_worker(channel, request, t0 + duration, counts) for _ in range(conc)))
    elapsed = time.perf_counter() - t0
    return {"rps": counts[0] / elapsed, "errors": counts[1]}


def start(impl: str, ports: list[int], workdir: Path) -> tuple[subprocess.Popen, float, float, float]:
    prefix, python = ("inferd.pytriton", sys.executable) if impl == "inferd" else ("pytriton", str(REF_PYTHON))
    script = workdir / ("serve_%s.py" % impl)
    script.write_text(PROGRAM.format(p=prefix, n=SHAPE))
    env = dict(os.environ)
    if impl != "inferd":  # the Python backend stub must load this Python's libpython (as triton_reference.sh run)
        libdir = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    t0 = time.perf_counter()
    with open(workdir / ("%s.log" % impl), "ab") as log:
        proc = subprocess.Popen([python, str(script), *map(str, ports)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, cwd=workdir, env=env)
    line = "x"
    while line and not line.startswith("READY"):  # PyTriton's tritonserver writes its log to stdout too
        line = proc.stdout.readline() if proc.stdout else ""
    wall = time.perf_counter() - t0
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError("%s did not start; see %s" % (impl, workdir / ("%s.log" % impl)))
    _, inside, since_start = line.split()
    return proc, float(inside), float(since_start), wall


def stop(proc: subprocess.Popen) -> None:
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--impls", default="inferd,pytriton")
    ap.add_argument("--conc", default="1,16")
    ap.add_argument("--base-port", type=int, default=19050)
    ap.add_argument("--json", default="", help="write every measurement here")
    args = ap.parse_args()
    impls = args.impls.split(",")
    concs = [int(c) for c in args.conc.split(",")]
    ports = [args.base_port, args.base_port + 1, args.base_port + 2]
    rows: dict[str, dict[str, list[float]]] = {i: {} for i in impls}
    workdir = Path(tempfile.mkdtemp(prefix="bench-pyapi-"))
    for run in range(args.runs):
        for impl in impls:
            proc, inside, since, wall = start(impl, ports, workdir)
            r = rows[impl]
            r.setdefault("startup_in_process_s", []).append(inside)
            r.setdefault("startup_wall_s", []).append(wall)
            try:
                for protocol in ("http", "grpc"):
                    for conc in concs:
                        port = ports[0] if protocol == "http" else ports[1]
                        res = asyncio.run(drive(protocol, port, conc, args.duration))
                        if res["errors"]:
                            print("  %s %s c=%d: %d errors" % (impl, protocol, conc, res["errors"]), file=sys.stderr)
                        r.setdefault("%s_c%d_rps" % (protocol, conc), []).append(res["rps"])
            finally:
                stop(proc)
            print("run %d %-8s %s" % (run + 1, impl, "  ".join(
                "%s=%.3g" % (k, v[-1]) for k, v in r.items())), flush=True)
    print("\nload average at the end: %s (2 vCPUs shared with other work)" % (os.getloadavg(),))
    print("%-22s %s" % ("metric", "  ".join("%-26s" % i for i in impls)))
    for key in rows[impls[0]]:
        cells = []
        for impl in impls:
            vals = rows[impl].get(key, [])
            cells.append("%-26s" % ("median %.4g [%.4g-%.4g]" % (statistics.median(vals), min(vals), max(vals))
                                    if vals else "-"))
        print("%-22s %s" % (key, "  ".join(cells)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
