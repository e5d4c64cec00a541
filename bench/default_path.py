"""The supervisor's own CPU cost per HTTP inference on the default scheduler's whole path, warm and in one
process: bench/run.py's add_sub JSON request (two FP32[16] inputs, no dynamic batching) from the HTTP
connection through the real Router, ServerDataPlane, DefaultScheduler (pipeline depth 8) and the instance
side (BatchPipeline, InputPacker, ZMTP encoding), the worker's answer given as the bytes a worker writes
and read back by instances/results, to the HTTP answer written by the same code as when served.

What it leaves out: sockets, the event loop's polling, the worker channel's ZMTP reader, other processes.
bench/hotpath.py measures the dynamic batcher's path with a stand-in instance; the served benchmarks
(run.py) are the measure. A guide for trimming the path, and an A/B tool: run it alternately from two
checkouts (each its own venv) and compare medians.

    .venv/bin/python bench/default_path.py                # median µs per request (process CPU time)
    .venv/bin/python bench/default_path.py --profile      # the same under cProfile, top functions by own time
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hotpath  # noqa: E402
from inferd.supervisor.core.dataplane_impl import ServerDataPlane  # noqa: E402
from inferd.supervisor.core.validate import IOSpec  # noqa: E402
from inferd.supervisor.http_api.connection import HttpConnection  # noqa: E402
from inferd.supervisor.http_api.routes import Router  # noqa: E402
from inferd.supervisor.http_api.server import HttpServer  # noqa: E402
from inferd.supervisor.instances import results  # noqa: E402
from inferd.supervisor.instances.packing import InputPacker  # noqa: E402
from inferd.supervisor.instances.pipeline import BatchPipeline  # noqa: E402
from inferd.supervisor.metrics.model_statistics import ModelStats  # noqa: E402
from inferd.supervisor.scheduler.default import DefaultScheduler  # noqa: E402
from inferd.worker.wire import writers, zmtp  # noqa: E402

DEPTH = 8  # config.py's pipeline_depth default
NAMES = ("INPUT0", "INPUT1")
CONFIG: dict[str, Any] = {
    "name": "add_sub", "max_batch_size": 0,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in NAMES],
    "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
}
BODY = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [16], "data": list(range(16))}
                              for n in NAMES]}, separators=(",", ":")).encode()
REQUEST = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: %d\r\n"
           b"Content-Type: application/json\r\n\r\n" % len(BODY)) + BODY
RAW = struct.pack("<16f", *range(16))
# the supervisor's reader of a worker's message (results.read; results.decode before it existed, so
# that the same script measures older checkouts too)
READ = getattr(results, "read", results.decode)


class Transport(hotpath.Transport):
    last: Any = b""

    def write(self, data: Any) -> None:
        self.writes += 1
        self.last = data


class Executor:
    """The instance as the scheduler sees it: the real pipeline's launch, always ready."""

    name = "add_sub_0"
    ready = True

    def __init__(self, pipeline: BatchPipeline) -> None:
        self.launch = pipeline.launch

    def cancel(self, requests: Any) -> None:
        pass


class Version(hotpath.Version):
    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler)
        self.name, self.config, self.io = "add_sub", CONFIG, IOSpec.from_config(CONFIG)
        self.device_inputs, self.host_only_inputs = False, ()


def answer(k: int) -> list[memoryview]:
    """The frames a worker sends for Execute k (batch k holds request k: one request per batch)."""
    refs = [writers.output_ref_json(n, "FP32", (16,), 0, i * 64, 64) for i, n in enumerate(("OUTPUT0", "OUTPUT1"))]
    header = writers.execute_result_header(k, [writers.response_item_json(k, refs)], 1, 2, 3)
    return [memoryview(header), memoryview(RAW + RAW)]


async def measure(connections: int, rounds: int, profiler: cProfile.Profile | None) -> list[float]:
    sent: list[Any] = []

    def send(frames: list[Any], hold: bool) -> None:
        zmtp.encode(frames)  # what Channel.send does before writing
        sent.append(frames)

    pipeline = BatchPipeline(depth=DEPTH, packer=InputPacker(None), outputs=None, model_version="1", send=send,
                             send_quiet=lambda msg: None, kill=lambda reason: None, refusal=lambda: None,
                             who=lambda: "worker")
    scheduler = DefaultScheduler("add_sub", [Executor(pipeline)], ModelStats("add_sub", "1"),  # type: ignore[list-item]
                                 max_queue_size=0, runners_per_instance=DEPTH)
    scheduler.start()
    dataplane = ServerDataPlane(hotpath.Manager(Version(scheduler)), server_id="bench",  # type: ignore[arg-type]
                                control_mode="none", strict_readiness=False, stats_registry=None,
                                metrics_renderer=None)
    dataplane.started = True
    server = HttpServer(Router(dataplane), max_body=1 << 26)
    conns = []
    for _ in range(connections):
        conn, transport = HttpConnection(server), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conns.append((conn, transport))
    for conn, _transport in conns:
        conn.data_received(REQUEST)
    replies = [answer(k) for k in range(1, (rounds + 1) * connections + 1)]  # made before timing
    replied = 0
    per_request = []
    for rnd in range(rounds):
        if profiler is not None and rnd == rounds // 5:
            profiler.enable()
        t0 = time.process_time_ns()
        for _ in range(connections):  # the worker answers each Execute in turn, as they were sent
            while not sent:
                await asyncio.sleep(0)
            sent.pop(0)
            msg, data = READ(replies[replied])
            replied += 1
            pipeline.on_result(msg, data)
            await asyncio.sleep(0)
        for _ in range(3):  # the answers' callbacks, the coalescer's flush
            await asyncio.sleep(0)
        for conn, _transport in conns:  # each client sends its next request
            conn.data_received(REQUEST)
        per_request.append((time.process_time_ns() - t0) / connections / 1000)
    if profiler is not None:
        profiler.disable()
    if any(not t.last.startswith(b"HTTP/1.1 200 OK") or t.writes < rounds for _c, t in conns):
        raise SystemExit("not every request was answered 200: the benchmark is out of step with the code")
    await scheduler.close()
    return per_request[rounds // 5:]  # the first fifth warms up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=16, help="clients, one request in flight each")
    ap.add_argument("--rounds", type=int, default=1500, help="rounds of one request per connection")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    gc.collect()  # as supervisor/main.py sets the collector up
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    profiler = cProfile.Profile() if args.profile else None
    per_request = uvloop.run(measure(max(1, args.connections), args.rounds, profiler))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    print(f"µs per request (median of {len(per_request)} rounds of {args.connections}): "
          f"{statistics.median(per_request):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
