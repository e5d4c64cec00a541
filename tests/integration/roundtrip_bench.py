"""Round-trip latency of a trivial Execute through Instance → channel → worker → back (not a test).

Usage: .venv/bin/python tests/integration/roundtrip_bench.py [--fake] [--uvloop] [-n 5000]
Prints spawn-to-ready time, round-trip percentiles and the supervisor's own CPU time per request
(event-loop thread CPU, i.e. the supervisor overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances.channel import Channel
from inferd.supervisor.instances.instance import Instance
from inferd.supervisor.instances.launcher import Launcher
from inferd.worker.wire import messages as m

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "instances", "fake_worker.py")
MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''
CONFIG = ('{"name":"echo","backend":"python","max_batch_size":0,'
          '"input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[1]}],'
          '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[1]}]}')


async def main(args: argparse.Namespace) -> None:
    run_dir = tempfile.mkdtemp(prefix="inferd-b")
    model_dir = os.path.join(run_dir, "echo")
    os.makedirs(os.path.join(model_dir, "1"))
    with open(os.path.join(model_dir, "1", "model.py"), "w") as f:
        f.write(MODEL)
    channel = Channel(run_dir)
    channel.open()
    command = [sys.executable, "-s", FAKE] if args.fake else None
    launcher = Launcher(run_dir, command=command)
    load = m.LoadModel("echo", model_dir, "1", CONFIG, "python", "echo_0", "CPU")
    inst = Instance(load, channel=channel, launcher=launcher, timings=WorkerTimings())
    t0 = time.perf_counter()
    await inst.start()
    spawn_ms = (time.perf_counter() - t0) * 1e3
    data = np.ones(1, np.float32).tobytes()
    req = InferRequest("echo", inputs=[Tensor("INPUT0", "FP32", [1], data)])
    for _ in range(500):
        await inst.execute([req])
    lat = []
    cpu0 = time.thread_time()
    for _ in range(args.n):
        t = time.perf_counter_ns()
        await inst.execute([req])
        lat.append(time.perf_counter_ns() - t)
    cpu = (time.thread_time() - cpu0) / args.n * 1e6
    await inst.drain_and_stop(1)
    channel.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    lat.sort()
    print("worker=%s loop=%s spawn-to-ready %.0f ms; round trip p50 %.0f us p90 %.0f us p99 %.0f us mean %.0f us;"
          " supervisor loop-thread CPU %.1f us/request" % (
              "fake" if args.fake else "real", "uvloop" if args.uvloop else "asyncio", spawn_ms,
              lat[len(lat) // 2] / 1e3, lat[len(lat) * 9 // 10] / 1e3, lat[len(lat) * 99 // 100] / 1e3,
              statistics.mean(lat) / 1e3, cpu))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--fake", action="store_true")
    p.add_argument("--uvloop", action="store_true")
    p.add_argument("-n", type=int, default=5000)
    a = p.parse_args()
    if a.uvloop:
        import uvloop

        uvloop.run(main(a))
    else:
        asyncio.run(main(a))
