"""The three-step pipeline (preprocess -> ONNX -> postprocess, 1 MiB intermediate tensor) served as one
ensemble, against the same three models called one after another by the client; and the cost of one
BLS call from a Python model against calling the callee's code directly in the same process.

    .venv/bin/python bench/pipeline.py [--seconds 5] [--pixels 262144] [--protocol grpc|http]

Concurrency 1, closed loop, unmodified tritonclient. The three-call path moves the 1 MiB FEATURES tensor
down to the client and back up; the ensemble keeps it inside the server (worker -> supervisor ->
shared memory -> worker). Target (pipelines issue): ensemble latency <= 0.6x the three-call sum.

BLS: the `bls_bench` model times, inside its execute, N sequential `exec()` calls to the add_sub example
model (FP32 [16] x 2) and N direct calls of add_sub's own `execute` imported into the caller's process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import pipeline_models as pm  # noqa: E402
from frameworks import free_port  # noqa: E402

BLS_BENCH = """
import importlib.util, json, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        spec = importlib.util.spec_from_file_location("callee", cfg["parameters"]["callee"]["string_value"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.callee = module.TritonPythonModel()
        outputs = [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")]
        self.callee.initialize({"model_config": json.dumps({"output": outputs})})

    def execute(self, requests):
        out = []
        for request in requests:
            p = json.loads(request.parameters())
            n, mode = int(p["calls"]), p["mode"]
            a = np.random.rand(16).astype(np.float32)
            inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)]
            t0 = time.perf_counter()
            for _ in range(n):
                req = pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                                requested_output_names=["OUTPUT0", "OUTPUT1"])
                if mode == "bls":
                    resp = req.exec()
                else:
                    resp = self.callee.execute([req])[0]
                pb_utils.get_output_tensor_by_name(resp, "OUTPUT0").as_numpy()
            per_us = (time.perf_counter() - t0) / n * 1e6
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("US", np.array([per_us], np.float32))]))
        return out
"""


def write_bls_bench(repo: Path) -> None:
    import shutil

    shutil.copytree(ROOT / "examples" / "add_sub", repo / "add_sub", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "bls_bench" / "1").mkdir(parents=True)
    (repo / "bls_bench" / "1" / "model.py").write_text(BLS_BENCH)
    (repo / "bls_bench" / "config.pbtxt").write_text(
        'name: "bls_bench"\nbackend: "python"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "US" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "callee" value: { string_value: "%s" } }\n' % (repo / "add_sub" / "1" / "model.py"))


def bls_overhead(client: Any, mod: Any, calls: int, rounds: int) -> tuple[float, float]:
    x = _input(mod, "X", np.zeros(1, np.float32), "FP32")
    bls, direct = [], []
    for _ in range(rounds):
        for mode, into in (("bls", bls), ("direct", direct)):
            result = client.infer("bls_bench", [x], parameters={"calls": calls, "mode": mode})
            into.append(float(result.as_numpy("US")[0]))
    return statistics.median(bls), statistics.median(direct)


def _client(protocol: str, url: str) -> tuple[Any, Any]:
    if protocol == "grpc":
        import tritonclient.grpc as mod
    else:
        import tritonclient.http as mod  # type: ignore[no-redef]
    return mod, mod.InferenceServerClient(url)


def _input(mod: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    inp = mod.InferInput(name, list(array.shape), datatype)
    if mod.__name__.endswith("http"):
        inp.set_data_from_numpy(array, binary_data=True)
    else:
        inp.set_data_from_numpy(array)
    return inp


def _outputs(mod: Any, names: list[str]) -> list[Any]:
    if mod.__name__.endswith("http"):
        return [mod.InferRequestedOutput(n, binary_data=True) for n in names]
    return [mod.InferRequestedOutput(n) for n in names]


def measure(fn: Any, seconds: float) -> list[float]:
    for _ in range(10):
        fn()
    samples: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def summary(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return (statistics.fmean(samples) * 1e3, ordered[len(ordered) // 2] * 1e3,
            ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pixels", type=int, default=262144)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--protocol", default="grpc", choices=["grpc", "http"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bls-calls", type=int, default=2000)
    args = ap.parse_args()
    repo = pm.write_pipeline(Path(tempfile.mkdtemp(prefix="inferd-pipe-bench-")) / "models", args.pixels, args.dim)
    write_bls_bench(repo)
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = open(repo.parent / "server.log", "wb")  # noqa: SIM115  (closed in the finally below)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "inferd"), "--model-repository", str(repo), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                ready_url = "http://127.0.0.1:%d/v2/models/pipeline/ready" % http
                if urllib.request.urlopen(ready_url, timeout=1).status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("server did not get ready; log in %s" % log.name)
            time.sleep(0.2)
        url = "127.0.0.1:%d" % (grpc if args.protocol == "grpc" else http)
        mod, client = _client(args.protocol, url)
        image = np.random.default_rng(0).integers(0, 256, args.pixels, dtype=np.uint8)
        image_in = _input(mod, "IMAGE", image, "UINT8")
        final = _outputs(mod, ["NORMALIZED", "LABEL"])

        def ensemble() -> None:
            client.infer("pipeline", [image_in], outputs=final)

        def three_calls() -> None:
            feats = client.infer("pipeline_pre", [image_in], outputs=_outputs(mod, ["FEATURES"])).as_numpy("FEATURES")
            emb = client.infer("pipeline_embed", [_input(mod, "FEATURES", feats, "FP32")],
                               outputs=_outputs(mod, ["EMBEDDING"])).as_numpy("EMBEDDING")
            client.infer("pipeline_post", [_input(mod, "EMBEDDING", emb, "FP32")], outputs=final)

        ens_all: list[float] = []
        three_all: list[float] = []
        for _ in range(args.rounds):  # interleaved rounds: drift on a shared machine hits both sides
            ens_all += measure(ensemble, args.seconds)
            three_all += measure(three_calls, args.seconds)
        e, t = summary(ens_all), summary(three_all)
        print("pixels %d (FEATURES %.2f MiB), protocol %s, c=1, %d rounds x %.0f s"
              % (args.pixels, args.pixels * 4 / 2**20, args.protocol, args.rounds, args.seconds))
        print("| path | mean ms | p50 ms | p99 ms |")
        print("|---|---|---|---|")
        print("| ensemble | %.2f | %.2f | %.2f |" % e)
        print("| three client calls | %.2f | %.2f | %.2f |" % t)
        print("ensemble / three calls (mean): %.2fx (target <= 0.6x)" % (e[0] / t[0]))
        bls_us, direct_us = bls_overhead(client, mod, args.bls_calls, max(3, args.rounds))
        print("BLS call (add_sub FP32[16]x2, %d sequential calls, median of rounds): %.1f us per call; direct "
              "in-process call of the callee's execute: %.1f us; overhead %.1f us per call"
              % (args.bls_calls, bls_us, direct_us, bls_us - direct_us))
    finally:
        server.terminate()
        server.wait(15)
        log.close()


if __name__ == "__main__":
    main()
