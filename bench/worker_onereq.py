"""The worker's CPU per request at concurrency 1, in one process: add_sub (Python backend, two FP32[16]
inputs) served one request per Execute through the worker's real ZMTP socket, channel, runtime, pb_utils
and result writer. The supervisor's side is played by this script on the other end of a Unix socket: it
writes the Execute the supervisor's InputPacker packs and reads the ExecuteResult back (checked once with
the supervisor's reader). Timed: from the worker's `recv` to the end of its send (syscalls included).

    .venv/bin/python bench/worker_onereq.py                # median µs per request (and CPU per request)
    .venv/bin/python bench/worker_onereq.py --profile      # under cProfile: calls per request, top functions
    .venv/bin/python bench/worker_onereq.py --model ort    # an ONNX Runtime model (onnx installed) instead
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferd.supervisor.inference.types import InferRequest, Tensor  # noqa: E402
from inferd.supervisor.instances import results  # noqa: E402
from inferd.supervisor.instances.packing import InputPacker  # noqa: E402
from inferd.worker.channel import Channel  # noqa: E402
from inferd.worker.message_loop import Runtime  # noqa: E402
from inferd.worker.wire import messages as m  # noqa: E402
from inferd.worker.wire import zmtp  # noqa: E402

ADD_SUB = Path(__file__).resolve().parent.parent / "examples" / "add_sub" / "1" / "model.py"  # as served

CONFIG = {"name": "add_sub", "backend": "python",
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                    {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                     {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]}


def ort_model(model_dir: Path) -> dict[str, Any]:
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [16])
    b = helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, [16])
    o0 = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [16])
    o1 = helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, [16])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                               helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
                              "add_sub", [a, b], [o0, o1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    return dict(CONFIG, backend="onnxruntime")


class Supervisor:
    """The supervisor's end of the worker link: a listening Unix socket, ZMTP greeting and READY."""

    def __init__(self, path: str) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self.conn: Any = None
        self._thread = threading.Thread(target=self._accept)
        self._thread.start()
        self._buf = bytearray()
        messages = zmtp.Messages(lambda c: setattr(messages, "handshaken", True), self._got)  # (the worker's READY)
        self._reader = zmtp.Reader(lambda g: None, messages.on_frame, 1 << 30)
        self._got_messages: list[list[memoryview]] = []

    def _accept(self) -> None:
        self.conn, _ = self._listener.accept()
        self.conn.sendall(zmtp.GREETING + zmtp.ready(b"ROUTER"))

    def joined(self) -> None:
        self._thread.join()

    def _got(self, parts: list[memoryview]) -> None:
        self._got_messages.append(parts)

    def send(self, frames: list[Any]) -> None:
        whole, pieces = zmtp.encode(frames)
        self.conn.sendall(whole if not pieces else b"".join(bytes(p) for p in pieces))

    def recv(self) -> list[bytes]:
        while not self._got_messages:
            self._reader.feed(self.conn.recv(1 << 16))
        return [bytes(p) for p in self._got_messages.pop(0)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--model", choices=("add_sub", "ort"), default="add_sub")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="tottime", help="pstats sort key with --profile (tottime, ncalls...)")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp()
    try:
        model_dir = Path(workdir) / "add_sub"
        (model_dir / "1").mkdir(parents=True)
        if args.model == "ort":
            config = ort_model(model_dir)
        else:
            (model_dir / "1" / "model.py").write_text(ADD_SUB.read_text())
            config = CONFIG
        path = os.path.join(workdir, "link")
        sup = Supervisor(path)
        channel = Channel("ipc://" + path, "w0")
        sup.joined()
        runtime = Runtime(channel)
        runtime._on_load(m.LoadModel(model_name="add_sub", model_dir=str(model_dir), version="1",
                                     config_json=json.dumps(config), backend=config["backend"],
                                     instance_name="add_sub_0", instance_kind="CPU"), [])
        loaded = sup.recv()
        if b'"error":null' not in loaded[0]:
            raise SystemExit("the model did not load: %s" % loaded[0].decode())
        packer = InputPacker(None)
        body0 = bytes(range(64))
        body1 = bytes(64)
        handlers = runtime._handlers
        times: list[int] = []
        warm = args.rounds // 5

        def one(i: int) -> None:
            nonlocal profiling
            req = InferRequest("add_sub", inputs=[Tensor("INPUT0", "FP32", [16], body0),
                                                  Tensor("INPUT1", "FP32", [16], body1)])
            packed = packer.pack([req])
            sup.send([packed.header(i), *packed.frames])
            if profiling:
                profiler.enable()
            t0 = time.perf_counter_ns()
            message, frames = channel.recv()
            handlers[type(message)](message, frames)
            times.append(time.perf_counter_ns() - t0)
            if profiling:
                profiler.disable()
            got = sup.recv()
            if i == 0:
                msg, data = results.decode([memoryview(f) for f in got])
                results.batch_result([req], packed.ids, msg, data, "1")
                out = req  # noqa: F841 - decoded without error
        profiler = cProfile.Profile()
        profiling = False
        cpu0 = 0
        for i in range(args.rounds):
            if i == warm:
                cpu0 = time.process_time_ns()
                profiling = args.profile
            one(i)
        cpu = time.process_time_ns() - cpu0
        if args.profile:
            stats = pstats.Stats(profiler)
            n = args.rounds - warm
            py_calls = sum(v[1] for k, v in stats.stats.items() if k[0] != "~")  # type: ignore[attr-defined]
            print("worker's calls per request: %.1f, of Python functions %.1f" % (stats.total_calls / n, py_calls / n))
            stats.sort_stats(args.sort).print_stats(args.top)
        kept = times[warm:]
        print("worker µs per request (median of %d): %.2f  [p10 %.2f, p90 %.2f]; whole loop CPU µs/round %.1f" % (
            len(kept), statistics.median(kept) / 1000, sorted(kept)[len(kept) // 10] / 1000,
            sorted(kept)[len(kept) * 9 // 10] / 1000, cpu / 1000 / len(kept)))
        runtime.release()
        channel.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
