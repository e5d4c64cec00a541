"""The supervisor's CPU cost on its side of the worker link for one batch of 32 (bench/batching.py's
fixed_cost model), warm and in one process (bench/worker_hotpath.py is the worker's side):

- reading the answer: the ExecuteResultColumns that worker_hotpath's worker writes, from the bytes its
  socket read to the batch's responses: the worker channel's ZMTP reader (instances/channel.py's
  connection, `data_received`), then what WorkerProcess._on_message and BatchPipeline.on_result do with
  it (results.read, results.batch_result). The scheduler's part of on_result (freeing the slot, settling
  the batch) is left out; bench/hotpath.py measures the batcher.
- sending the Execute: InputPacker.pack (an ExecuteColumns), its header and ZMTP encoding (Channel.send
  without the socket write).

    .venv/bin/python bench/worker_link.py              # median µs per batch, each side
    .venv/bin/python bench/worker_link.py --profile    # reading under cProfile, top functions by own time
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_hotpath  # noqa: E402
from inferd.supervisor.inference.types import InferRequest, Tensor  # noqa: E402
from inferd.supervisor.instances import channel, results  # noqa: E402
from inferd.supervisor.instances.packing import InputPacker  # noqa: E402
from inferd.worker.channel import header_loads  # noqa: E402
from inferd.worker.wire import messages as m  # noqa: E402
from inferd.worker.wire import zmtp  # noqa: E402

BATCH = worker_hotpath.BATCH
IDENTITY = "w0"


def answer(workdir: str) -> tuple[list[InferRequest], list[int], bytes]:
    """The requests of one batch, their ids, and the bytes of the worker's answer as its socket writes
    them (one ZMTP message)."""
    runtime, kept = worker_hotpath.load(workdir)
    body = np.arange(4, dtype="<f4").tobytes()
    requests = [InferRequest("fixed_cost", inputs=[Tensor("INPUT0", "FP32", [1, 4], body)]) for _ in range(BATCH)]
    packed = InputPacker(None).pack(requests)
    message = m.decode_header(packed.header(1), header_loads)
    runtime._handlers[type(message)](message, [memoryview(f) for f in packed.frames])
    (header, frames), = kept.sent
    if b'"t":"execute_result_columns"' not in header:
        raise SystemExit("the worker did not answer by columns: %s" % header[:200].decode())
    whole, pieces = zmtp.encode([header, *frames])
    return requests, list(packed.ids), whole or b"".join(bytes(p) for p in pieces)


def connection(on_message: Any) -> channel._Peer:
    """The channel's connection of one worker, past its handshake, its messages to `on_message`."""
    chan = channel.Channel(tempfile.gettempdir())
    peer = channel._Peer(chan)
    peer._reader.feed(zmtp.GREETING)
    peer.identity = IDENTITY
    peer._ready = True
    chan._handlers[IDENTITY] = on_message
    return peer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5000, help="answers of batches of 32 requests")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        requests, ids, data = answer(workdir)
    got: list[Any] = []

    def on_message(frames: list[Any]) -> None:  # WorkerProcess._on_message, then BatchPipeline.on_result's read
        msg, parts = results.read(frames)
        got.append(results.batch_result(requests, ids, msg, parts, "1", None))

    packer = InputPacker(None)
    pack_times: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter_ns()
        packed = packer.pack(requests)
        zmtp.encode([packed.header(1), *packed.frames])
        pack_times.append((time.perf_counter_ns() - t0) / 1000)
        if packed.columns is None:
            raise SystemExit("the batch did not go by columns")
    peer = connection(on_message)
    times: list[float] = []
    profiler = cProfile.Profile() if args.profile else None
    for i in range(args.rounds):
        if profiler is not None and i == args.rounds // 5:
            profiler.enable()
        t0 = time.perf_counter_ns()
        peer.data_received(data)
        times.append((time.perf_counter_ns() - t0) / 1000)
        result, = got
        got.clear()
        if len(result.responses) != BATCH:
            raise SystemExit("expected %d responses" % BATCH)
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    kept = times[args.rounds // 5:]
    print("supervisor µs per answer of %d (median of %d): %.1f" % (BATCH, len(kept), statistics.median(kept)))
    print("supervisor µs per Execute of %d (pack, header, ZMTP): %.1f"
          % (BATCH, statistics.median(pack_times[args.rounds // 5:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
