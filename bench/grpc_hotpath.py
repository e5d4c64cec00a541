"""The supervisor's own CPU cost per gRPC ModelInfer on the native HTTP/2 server, warm and in one process:
what the gRPC request path costs before sockets, wake-ups and other processes add theirs (hotpath.py is the
same for HTTP, whose stand-in model, batcher and data plane this reuses). A guide for optimizing that path;
the served benchmarks (run.py) are the measure.

32 H2Connections (with in-memory transports) each take one ModelInfer per round, as h2load sends it: HEADERS
(HPACK from the `hpack` package's encoder, so later calls are table references) and one DATA frame with
END_STREAM, in one read. The real NativeGrpcServer methods, InferenceService, ServerDataPlane and
DynamicBatcher queue them as one batch of 32, which a stand-in instance answers at once; the answers are
built and written by the same code as when served.

    .venv/bin/python bench/grpc_hotpath.py               # median µs per request: intake, answer, total
    .venv/bin/python bench/grpc_hotpath.py --profile     # the same under cProfile, top functions by own time
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import hpack
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hotpath import BATCH, CONFIG, OUTPUT, Instance, Manager, Stats, Transport, Version  # noqa: E402
from inferd.supervisor._gen import grpc_service_pb2 as pb  # noqa: E402
from inferd.supervisor.core.dataplane_impl import ServerDataPlane  # noqa: E402
from inferd.supervisor.grpc_api.http2 import frames as f  # noqa: E402
from inferd.supervisor.grpc_api.http2.connection import H2Connection  # noqa: E402
from inferd.supervisor.grpc_api.native_server import NativeGrpcServer, build_methods  # noqa: E402
from inferd.supervisor.grpc_api.servicer import InferenceService  # noqa: E402
from inferd.supervisor.inference.types import InferResponse, Tensor  # noqa: E402
from inferd.supervisor.scheduler.batching import BatchRules  # noqa: E402
from inferd.supervisor.scheduler.dynamic import DynamicBatcher  # noqa: E402
from inferd.supervisor.scheduler.policy import PriorityPolicy  # noqa: E402

HEADERS = [
    (":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:8001"), ("content-type", "application/grpc"), ("te", "trailers"),
    ("user-agent", "h2load nghttp2/1.52.0"),
]


def _message() -> bytes:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(OUTPUT)
    body = req.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


class Client:
    """One connection's client side: the preface once, then a call per round on a new stream."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.sid = 1
        self.message = _message()

    def opening(self) -> bytes:
        return f.PREFACE + f.settings({}) + f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW)  # never runs dry

    def call(self) -> bytes:
        block = self.encoder.encode(HEADERS)
        sid, self.sid = self.sid, self.sid + 2
        return (f.header(len(block), f.HEADERS, f.END_HEADERS, sid) + block
                + f.header(len(self.message), f.DATA, f.END_STREAM, sid) + self.message)


async def measure(rounds: int, profiler: cProfile.Profile | None = None) -> tuple[list[float], list[float]]:
    instance = Instance()
    policy = PriorityPolicy.from_dynamic_batching(CONFIG["dynamic_batching"], 0)
    batcher = DynamicBatcher("m", [instance], Stats(), BatchRules.from_config(CONFIG),  # type: ignore[list-item,arg-type]
                             policy)
    batcher.start()
    dataplane = ServerDataPlane(Manager(Version(batcher)), server_id="bench", control_mode="none",  # type: ignore[arg-type]
                                strict_readiness=False, stats_registry=None, metrics_renderer=None, tracer=None)
    dataplane.started = True
    server = NativeGrpcServer(build_methods(InferenceService(dataplane)))  # type: ignore[arg-type]
    connections = []
    for _ in range(BATCH):
        conn, transport, client = H2Connection(server), Transport(), Client()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(client.opening())
        connections.append((conn, transport, client))
    base = [t.writes for _c, t, _cl in connections]
    intake, answer = [], []
    script = [[client.call() for _c, _t, client in connections] for _ in range(rounds)]  # encoded beforehand
    if profiler is not None:
        profiler.enable()
    for calls in script:
        t0 = time.perf_counter_ns()
        for (conn, _transport, _client), data in zip(connections, calls):
            conn.data_received(data)
        await asyncio.sleep(0)  # the batcher sends its batch once the pass is over
        t1 = time.perf_counter_ns()
        (future, requests), = instance.sent
        instance.sent.clear()
        future.set_result(Result([InferResponse("m", "1", r.id, [Tensor("OUTPUT0", "FP32", [1, 4], OUTPUT)])
                                  for r in requests]))
        for _ in range(3):  # the batch's callback, the answers' callbacks
            await asyncio.sleep(0)
        t2 = time.perf_counter_ns()
        intake.append((t1 - t0) / BATCH / 1000)
        answer.append((t2 - t1) / BATCH / 1000)
    if profiler is not None:
        profiler.disable()
    if any(t.writes - b != rounds for (_c, t, _cl), b in zip(connections, base)):
        raise SystemExit("not every request was answered in one write: the benchmark is out of step with the code")
    await batcher.close()
    return intake[rounds // 5:], answer[rounds // 5:]  # the first fifth warms up


class Result:
    def __init__(self, responses: list[InferResponse]) -> None:
        self.responses = responses
        self.compute_input_ns = self.compute_infer_ns = self.compute_output_ns = 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3000, help="batches of 32 requests")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    intake, answer = uvloop.run(measure(args.rounds, profiler))
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    a, b = statistics.median(intake), statistics.median(answer)
    print(f"µs per request (median of {len(intake)} batches of {BATCH}): intake {a:.1f}, answer {b:.1f}, "
          f"total {a + b:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


