"""The worker's CPU cost per batch, warm and in one process: bench/batching.py's fixed_cost model (its 5 ms
sleep left out) served a batch of 32 by columns, from the supervisor's packed Execute to the ExecuteResult
the supervisor reads. What the worker's Python adds around a model's execute(); a guide for optimizing that
path (bench/hotpath.py is the supervisor's counterpart; the served benchmarks are the measure).

The real InputPacker, worker Runtime (PythonBackend, pb_utils) and result reader run; the worker's channel
is a stand-in that keeps what would be sent.

    .venv/bin/python bench/worker_hotpath.py              # median µs per batch, worker side (handler; and
                                                          # with the header's decode in the worker's channel)
    .venv/bin/python bench/worker_hotpath.py --profile    # the same under cProfile, top functions by own time
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd.supervisor.inference.types import InferRequest, Tensor  # noqa: E402
from inferd.supervisor.instances import results  # noqa: E402
from inferd.supervisor.instances.packing import InputPacker  # noqa: E402
from inferd.worker.channel import header_loads  # noqa: E402
from inferd.worker.message_loop import Runtime  # noqa: E402
from inferd.worker.wire import messages as m  # noqa: E402

MODEL_SRC = Path(__file__).resolve().parent / "models" / "fixed_cost"
BATCH = 32


class Kept:
    """The worker's channel: keeps what it would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[Any]]] = []

    def send(self, message: Any, frames: Any = ()) -> None:
        self.sent.append((m.encode_header(message), list(frames)))

    def send_encoded(self, header: bytes, frames: Any = ()) -> None:
        self.sent.append((header, list(frames)))


def load(workdir: str) -> tuple[Runtime, Kept]:
    model_dir = Path(workdir) / "fixed_cost"
    shutil.copytree(MODEL_SRC, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
    source = model_dir / "1" / "model.py"
    source.write_text(source.read_text().replace("time.sleep(self.cost_s)", "pass"))
    config = {"name": "fixed_cost", "backend": "python", "max_batch_size": BATCH,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    channel = Kept()
    runtime = Runtime(channel)  # type: ignore[arg-type]
    runtime._on_load(m.LoadModel(model_name="fixed_cost", model_dir=str(model_dir), version="1",
                                 config_json=json.dumps(config), backend="python", instance_name="fixed_cost_0",
                                 instance_kind="CPU"), [])
    (header, _), = channel.sent
    if b'"error":null' not in header:
        raise SystemExit("the model did not load: %s" % header.decode())
    channel.sent.clear()
    return runtime, channel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2000, help="batches of 32 requests")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        runtime, channel = load(workdir)
        packer = InputPacker(None)
        body = np.arange(4, dtype="<f4").tobytes()
        times: list[float] = []  # the Execute's handler
        with_decode: list[float] = []  # the same and the decode of its header before it

        def one_batch() -> None:
            requests = [InferRequest("fixed_cost", inputs=[Tensor("INPUT0", "FP32", [1, 4], body)])
                        for _ in range(BATCH)]
            packed = packer.pack(requests)
            header = packed.header(1)
            frames = [memoryview(f) for f in packed.frames]
            t0 = time.perf_counter_ns()
            message = m.decode_header(header, header_loads)  # (the worker's channel decodes it)
            t1 = time.perf_counter_ns()
            runtime._handlers[type(message)](message, frames)
            t2 = time.perf_counter_ns()
            times.append((t2 - t1) / 1000)
            with_decode.append((t2 - t0) / 1000)
            (raw, out), = channel.sent
            channel.sent.clear()
            msg, data = results.decode([raw, *[memoryview(f) for f in out]])
            results.batch_result(requests, packed.ids, msg, data, "1")

        profiler = cProfile.Profile() if args.profile else None
        for i in range(args.rounds):
            if profiler is not None and i == args.rounds // 5:
                profiler.enable()
            one_batch()
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    kept = args.rounds // 5
    print("worker µs per batch of %d (median of %d): %.1f" % (BATCH, len(times[kept:]),
                                                              statistics.median(times[kept:])))
    print("with the decode of the Execute's header: %.1f" % statistics.median(with_decode[kept:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
