"""The supervisor's own CPU cost per HTTP inference, warm and in one process: what the request path costs
before sockets, wake-ups and other processes add theirs. A guide for optimizing that path; the served
benchmarks (run.py, batching.py) are the measure.

32 HttpConnections (with in-memory transports) each take one KServe v2 JSON request per round; the real
Router, InferCodec, ServerDataPlane and DynamicBatcher queue them as one batch of 32, which a stand-in
instance answers at once; the answers are built and written by the same code as when served. Each
connection sends the same bytes every round, as wrk and perf_analyzer do, so from the second round on its
requests are read through the head it kept (http_api/request_reader.py), not httptools.

    .venv/bin/python bench/hotpath.py               # median µs per request: intake, answer, total
    .venv/bin/python bench/hotpath.py --profile     # the same under cProfile, top functions by own time
    .venv/bin/python bench/hotpath.py --trace-file /tmp/t.json   # every request traced (level TIMESTAMPS)
    .venv/bin/python bench/hotpath.py --batch 1     # one connection, batches of one: the c=1 path
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd.supervisor.core.dataplane_impl import ServerDataPlane  # noqa: E402
from inferd.supervisor.core.validate import IOSpec  # noqa: E402
from inferd.supervisor.http_api.connection import HttpConnection  # noqa: E402
from inferd.supervisor.http_api.routes import Router  # noqa: E402
from inferd.supervisor.http_api.server import HttpServer  # noqa: E402
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor  # noqa: E402
from inferd.supervisor.instances.pipeline import BatchFuture  # noqa: E402
from inferd.supervisor.scheduler.batching import BatchRules  # noqa: E402
from inferd.supervisor.scheduler.dynamic import DynamicBatcher  # noqa: E402
from inferd.supervisor.scheduler.policy import PriorityPolicy  # noqa: E402
from inferd.supervisor.tracing import live  # noqa: E402
from inferd.supervisor.tracing.options import TraceOptions  # noqa: E402
from inferd.supervisor.tracing.record import watch_batch  # noqa: E402
from inferd.supervisor.tracing.tracer import Tracer  # noqa: E402

BATCH = 32
BODY = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
REQUEST = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: %d\r\n"
           b"Content-Type: application/json\r\n\r\n" % len(BODY)) + BODY
OUTPUT = struct.pack("<4f", 1, 2, 3, 4)
OUTPUTS = [("OUTPUT0", [1, 4], OUTPUT)]
CONFIG: dict[str, Any] = {
    "name": "m", "max_batch_size": BATCH, "dynamic_batching": {"max_queue_delay_microseconds": 10_000_000},
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


def use_body(kind: str) -> None:
    """--body add_sub / add_sub_binary: bench/run.py's add_sub request (two FP32[16] inputs, JSON data or
    binary tensors asking for binary outputs), batch dimension added."""
    global REQUEST, OUTPUTS
    if kind == "small":
        return
    names = ("INPUT0", "INPUT1")
    CONFIG["input"] = [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in names]
    CONFIG["output"] = [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")]
    raw = struct.pack("<16f", *range(16))
    OUTPUTS = [("OUTPUT0", [1, 16], raw), ("OUTPUT1", [1, 16], raw)]
    if kind == "add_sub":
        body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}
                                      for n in names]}, separators=(",", ":")).encode()
        extra = b"Content-Type: application/json\r\n"
    else:
        head = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16],
                                       "parameters": {"binary_data_size": 64}} for n in names],
                           "outputs": [{"name": n, "parameters": {"binary_data": True}}
                                       for n in ("OUTPUT0", "OUTPUT1")]}, separators=(",", ":")).encode()
        body = head + raw + raw
        extra = b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %d\r\n" % len(head)
    REQUEST = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: %d\r\n"
               % len(body)) + extra + b"\r\n" + body


class Stats:
    """The statistics sink, counting nothing (its cost in the served path is one call per batch)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Result:
    def __init__(self, responses: list[InferResponse]) -> None:
        self.responses = responses
        self.compute_input_ns = self.compute_infer_ns = self.compute_output_ns = 0


class Instance:
    """An instance whose batches the benchmark answers by hand."""

    name = "m_0"
    ready = True

    def __init__(self) -> None:
        self.sent: list[tuple[BatchFuture, list[InferRequest]]] = []

    def launch(self, requests: list[InferRequest], on_free: Any = None) -> asyncio.Future[Result]:
        future = BatchFuture(loop=asyncio.get_running_loop())  # as instances.pipeline: `eager` offered
        future.eager = None
        if live.armed:  # as instances.instance.Instance.launch
            watch_batch(future, requests, self.name, time.monotonic_ns())
        self.sent.append((future, requests))
        return future

    def cancel(self, requests: Any) -> None:
        pass


class Version:
    """What ServerDataPlane needs of a loaded model version."""

    def __init__(self, scheduler: DynamicBatcher) -> None:
        self.name, self.version, self.config = "m", 1, CONFIG
        self.decoupled, self.ready, self.cache_generation = False, True, 0
        self.io = IOSpec.from_config(CONFIG)
        self.stats = Stats()
        self.scheduler = scheduler


class Entry:
    def __init__(self, version: Version) -> None:
        self.versions = {version.version: version}
        self.records: dict[Any, Any] = {}


class Manager:
    """What ServerDataPlane needs of the model registry: one model, one ready version."""

    def __init__(self, version: Version) -> None:
        self.entries = {version.name: Entry(version)}

    def watch(self, callback: Any) -> None:
        """One ready version that never changes: nothing to tell."""

    def lookup(self, name: str) -> Entry | None:
        return self.entries.get(name)


class Transport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: Any) -> None:
        self.writes += 1

    def writelines(self, data: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, *args: Any, **kwargs: Any) -> None:
        return None


async def measure(rounds: int, trace_file: str = "") -> tuple[list[float], list[float]]:
    instance = Instance()
    policy = PriorityPolicy.from_dynamic_batching(CONFIG["dynamic_batching"], 0)
    batcher = DynamicBatcher("m", [instance], Stats(), BatchRules.from_config(CONFIG),  # type: ignore[list-item,arg-type]
                             policy)
    batcher.start()
    dataplane = ServerDataPlane(Manager(Version(batcher)), server_id="bench", control_mode="none",  # type: ignore[arg-type]
                                strict_readiness=False, stats_registry=None, metrics_renderer=None,
                                tracer=Tracer(TraceOptions(level=("TIMESTAMPS",), rate=1, file=trace_file))
                                if trace_file else None)
    dataplane.started = True
    server = HttpServer(Router(dataplane), max_body=1 << 26)
    connections = []
    for _ in range(BATCH):
        conn, transport = HttpConnection(server), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        connections.append((conn, transport))
    intake, answer = [], []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for conn, _transport in connections:
            conn.data_received(REQUEST)
        await asyncio.sleep(0)  # the batcher sends its batch once the pass is over
        t1 = time.perf_counter_ns()
        (future, requests), = instance.sent
        instance.sent.clear()
        eager = future.eager  # as pipeline.on_result: the batch's eager callback runs within the read
        if eager is not None:
            future.eager = None
            future.remove_done_callback(eager)
        future.set_result(Result([InferResponse("m", "1", r.id, [Tensor(n, "FP32", list(shape), data)
                                                                 for n, shape, data in OUTPUTS])
                                  for r in requests]))
        if eager is not None:
            eager(future)
        for _ in range(3):  # the batch's callback, the answers' callbacks, the coalescer's flush
            await asyncio.sleep(0)
        t2 = time.perf_counter_ns()
        intake.append((t1 - t0) / BATCH / 1000)
        answer.append((t2 - t1) / BATCH / 1000)
    if any(transport.writes != rounds for _conn, transport in connections):
        raise SystemExit("not every request was answered: the benchmark is out of step with the code")
    await batcher.close()
    dataplane.tracer.close()
    return intake[rounds // 5:], answer[rounds // 5:]  # the first fifth warms up


def main() -> int:
    global BATCH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3000, help="batches of --batch requests")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="connections, each sending one request per round (1: the c=1 path, a batch per request)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--trace-file", default="", help="trace every request (rate 1, TIMESTAMPS) into this file")
    ap.add_argument("--body", choices=["small", "add_sub", "add_sub_binary"], default="small",
                    help="small: one FP32[4] JSON input; add_sub(_binary): bench/run.py's add_sub request")
    args = ap.parse_args()
    BATCH = CONFIG["max_batch_size"] = max(1, args.batch)
    use_body(args.body)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    intake, answer = uvloop.run(measure(args.rounds, args.trace_file))
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    a, b = statistics.median(intake), statistics.median(answer)
    print(f"µs per request (median of {len(intake)} batches of {BATCH}): intake {a:.1f}, answer {b:.1f}, "
          f"total {a + b:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
