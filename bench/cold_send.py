"""What a pause costs the worker's code: one streamed token's `response_sender.send()` (pb_utils response ->
StreamResponse encoded and posted), timed warm (back to back) and after the thread has slept or spun for a
while, in one process with the real Runtime and Python backend (the worker's channel is a stand-in that
keeps what would be sent). On a VM the same few thousand instructions can cost ten times more after a
10 ms sleep; that is the floor under issue 37's time to first token at c=1, where every hop starts cold.

    .venv/bin/python bench/cold_send.py            # median µs per send() after each kind of pause
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import worker_hotpath  # noqa: E402  (bench/worker_hotpath.py: its stand-in channel)
from inferd.supervisor.inference.types import InferRequest, Tensor  # noqa: E402
from inferd.supervisor.instances.packing import InputPacker  # noqa: E402
from inferd.worker.channel import header_loads  # noqa: E402
from inferd.worker.message_loop import Runtime  # noqa: E402
from inferd.worker.wire import messages as m  # noqa: E402

MODEL_SRC = Path(__file__).resolve().parent / "models" / "stream_keep"
CONFIG = {"name": "stream_keep", "backend": "python", "max_batch_size": 0,
          "model_transaction_policy": {"decoupled": True},
          "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
          "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}]}


class Kept(worker_hotpath.Kept):
    """bench/worker_hotpath.py's stand-in channel, with a descriptor for a decoupled model's poller."""

    def fileno(self) -> int:
        return 0


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sends", type=int, default=300, help="sends per kind of pause")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = Path(workdir) / "stream_keep"
        shutil.copytree(MODEL_SRC, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
        channel = Kept()
        runtime = Runtime(channel)  # type: ignore[arg-type]
        runtime._on_load(m.LoadModel(model_name="stream_keep", model_dir=str(model_dir), version="1",
                                     config_json=json.dumps(CONFIG), backend="python",
                                     instance_name="stream_keep_0", instance_kind="CPU"), [])
        if b'"error":null' not in channel.sent[0][0]:
            raise SystemExit("the model did not load: %s" % channel.sent[0][0].decode())
        packed = InputPacker(None).pack([InferRequest("stream_keep", inputs=[
            Tensor("text_input", "BYTES", [1], b"\x05\x00\x00\x00hello")])])
        message = m.decode_header(packed.header(1), header_loads)
        runtime._handlers[type(message)](message, [memoryview(f) for f in packed.frames])
        backend: Any = runtime._backend
        deadline = time.monotonic() + 10
        while not backend._model.kept:  # execute runs on the execute thread
            assert time.monotonic() < deadline, "execute never ran"
            time.sleep(0.01)
        pb = backend._pb
        sender = backend._model.kept[0].get_response_sender()
        outbox: Any = runtime._outbox
        token = np.array([b" 12"], dtype=np.object_)

        def timed(pause: Callable[[], None]) -> float:
            times = []
            for _ in range(args.sends):
                pause()
                response = pb.InferenceResponse([pb.Tensor("text_output", token)])
                t0 = time.perf_counter_ns()
                sender.send(response)
                times.append((time.perf_counter_ns() - t0) / 1000)
                outbox._queue.clear()
            return statistics.median(times)

        pauses: list[tuple[str, Callable[[], None]]] = [
            ("none (back to back)", lambda: None), ("sleep 0.2 ms", lambda: time.sleep(0.0002)),
            ("sleep 1 ms", lambda: time.sleep(0.001)), ("sleep 10 ms", lambda: time.sleep(0.01)),
            ("spin 10 ms", lambda: spin(0.01))]
        timed(lambda: None)  # warm-up
        result = {label: timed(pause) for label, pause in pauses}
    if args.json:
        print(json.dumps(result))
    else:
        for label, us in result.items():
            print("%-22s %7.1f µs per send()" % (label, us))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
