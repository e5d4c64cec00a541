"""Harness for supervision tests against the real worker (`python -m inferd.worker`).

Each test gets a short run dir with an open Channel, a Launcher and a ShmPool, and writes tiny Triton
Python models into tmp_path. Timings are the test profile: heartbeat 0.1 s x 4, restart backoff
0.1 s doubling to 0.4 s, give up after 5.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.supervisor.instances.channel import Channel
from inferd.supervisor.instances.instance import Instance, InstanceState
from inferd.supervisor.instances.launcher import Launcher
from inferd.supervisor.memory.shm_pool import ShmPool
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import InferdError

TIMINGS = WorkerTimings(
    heartbeat_interval_s=0.1,
    heartbeat_misses=4,
    spawn_timeout_s=20.0,
    load_timeout_s=20.0,
    autocomplete_timeout_s=20.0,
    stop_timeout_s=3.0,
    restart_base_s=0.1,
    restart_cap_s=0.4,
    restart_give_up=5,
    healthy_run_s=10.0,
)

# A model for most tests: INPUT0 (FP32 [-1]) = seconds to sleep (first element); OUTPUT0 echoes it,
# PID reports the serving process. Request parameter "crash": "exit0" / "abort" / "kill".
SLEEP_MODEL = '''
import os, signal, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "FAIL_INIT")
        if os.path.exists(marker):
            raise RuntimeError("initialize refuses: " + open(marker).read())
        open(os.path.join(args["model_repository"], "STARTED"), "a").write("%d\\n" % os.getpid())

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            crash = r.parameters() and __import__("json").loads(r.parameters()).get("crash")
            if crash == "exit0":
                os._exit(0)
            if crash == "abort":
                os.abort()
            if crash == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if x.size and x.reshape(-1)[0] > 0:
                time.sleep(float(x.reshape(-1)[0]))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.astype(np.float32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return out
'''


def config_json(name: str) -> str:
    return json.dumps({
        "name": name, "backend": "python", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
                   {"name": "PID", "data_type": "TYPE_INT64", "dims": [1]}],
    })


def write_model(root: str, name: str, source: str = SLEEP_MODEL, instance: int = 0) -> m.LoadModel:
    model_dir = os.path.join(root, name)
    os.makedirs(os.path.join(model_dir, "1"), exist_ok=True)
    with open(os.path.join(model_dir, "1", "model.py"), "w") as f:
        f.write(source)
    return m.LoadModel(name, model_dir, "1", config_json(name), "python", f"{name}_{instance}", "CPU")


def request(model: str, values: list[float] | np.ndarray, **params: object) -> InferRequest:
    data = np.asarray(values, dtype=np.float32)
    return InferRequest(model, id="t", inputs=[Tensor("INPUT0", "FP32", [data.size], data.tobytes())],
                        parameters=dict(params))


def output(response: InferResponse | InferdError, name: str = "OUTPUT0") -> np.ndarray:
    assert isinstance(response, InferResponse), response
    tensor = next(t for t in response.outputs if t.name == name)
    dtype = np.float32 if tensor.datatype == "FP32" else np.int64
    return np.frombuffer(tensor.data, dtype=dtype)


def alive(pid: int) -> bool:
    """Running and not a zombie (a zombie is dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def our_shm(pid: int | None = None) -> list[str]:
    """Names under /dev/shm of regions `pid` created (none: regions are unlinked at creation)."""
    prefix = f"inferd_{pid or os.getpid()}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def held_shm(pid: int | None = None) -> list[str]:
    """Handles of the regions process `pid` created and keeps open (its fds on unlinked /dev/shm files)."""
    pid = pid or os.getpid()
    prefix = f"/dev/shm/inferd_{pid}_"
    names = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith(" (deleted)"):
            names.add(target[len("/dev/shm/"): -len(" (deleted)")])
    return sorted(names)


class StateWatch:
    """on_change recorder: await a state without polling."""

    def __init__(self) -> None:
        self.history: list[tuple[float, InstanceState, int | None]] = []
        self._event = asyncio.Event()

    def __call__(self, inst: Instance) -> None:
        self.history.append((time.monotonic(), inst.state, inst.pid))
        self._event.set()

    async def wait(self, inst: Instance, *states: InstanceState, timeout: float = 10.0) -> None:
        async def until() -> None:
            while inst.state not in states:
                self._event.clear()
                await self._event.wait()

        await asyncio.wait_for(until(), timeout)

    def count(self, state: InstanceState) -> int:
        return sum(1 for _, s, _ in self.history if s is state)


@dataclass
class Env:
    run_dir: str
    models: str
    channel: Channel
    launcher: Launcher
    pool: ShmPool
    instances: list[Instance]

    def instance(self, load: m.LoadModel, on_change: Callable[[Instance], None] | None = None,
                 timings: WorkerTimings = TIMINGS) -> Instance:
        inst = Instance(load, channel=self.channel, launcher=self.launcher, timings=timings, pool=self.pool,
                        on_change=on_change)
        self.instances.append(inst)
        return inst


@pytest.fixture
async def env(tmp_path):
    run_dir = tempfile.mkdtemp(prefix="inferd-i")
    channel = Channel(run_dir)
    channel.open()
    e = Env(run_dir, str(tmp_path), channel, Launcher(run_dir), ShmPool(max_bytes=256 << 20), [])
    try:
        yield e
    finally:
        await asyncio.gather(*(i.drain_and_stop(0) for i in e.instances), return_exceptions=True)
        e.pool.close()
        channel.close()
        shutil.rmtree(run_dir, ignore_errors=True)
