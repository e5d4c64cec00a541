"""Both zero-copy paths of client CUDA shared memory through a real worker, on a CPU: only the CUDA runtime
is stood in for (tests/fake_cuda.py, in this process and in the worker: "device memory" is a shared memory
file, its IPC handle the file's name). The supervisor's region table runs on the real IpcDevice over
wire.cuda_ipc. A client region's input reaches the model of a KIND_GPU instance on the device, read in
place from the client's allocation; the model's device output comes back by IPC handle and is copied
device to device into the client's output region."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor
from inferd.supervisor.memory.client_shm import ClientShm
from inferd.supervisor.memory.cuda_device import IpcDevice
from inferd.supervisor.memory.cuda_regions import CudaRegions
from inferd.worker.wire import cuda_ipc
from inferd.worker.wire import messages as m

sys.path.insert(0, str(Path(__file__).parents[1]))
import fake_cuda  # noqa: E402  (tests/fake_cuda.py)

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
import fake_cuda

class TritonPythonModel:
    def initialize(self, args):
        self.rt = fake_cuda.install()

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            host = x.as_numpy() if x.is_cpu() else fake_cuda.to_host(x)
            y = pb_utils.Tensor.from_dlpack("OUTPUT0", fake_cuda.FakeGpuArray(self.rt, host * 2))
            on_gpu = pb_utils.Tensor("ON_GPU", np.array([not x.is_cpu()], dtype=np.bool_))
            out.append(pb_utils.InferenceResponse([y, on_gpu]))
        return out
'''
CONFIG = {
    "name": "double", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
               {"name": "ON_GPU", "data_type": "TYPE_BOOL", "dims": [1]}],
    "parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}},
}
N = 1 << 18  # FP32 elements: 1 MiB


class ClientAllocation:
    """A client's "cudaMalloc": a file the fake runtime maps; the handle is its name."""

    def __init__(self, tag: str, nbytes: int) -> None:
        self.name = "%sclient%d_%s" % (fake_cuda.PREFIX, os.getpid(), tag)  # not this process's own prefix
        self.path = Path("/dev/shm") / self.name
        with open(self.path, "wb") as f:
            f.truncate(nbytes)
        self.handle = self.name.encode().ljust(cuda_ipc.HANDLE_BYTES, b"\0")

    def array(self) -> np.ndarray:
        return np.fromfile(self.path, dtype=np.float32)


@pytest.fixture
def sim(monkeypatch):
    monkeypatch.setattr(cuda_ipc, "_runtime", fake_cuda.ShmCuda())
    monkeypatch.setattr(cuda_ipc, "_opened", {})
    made: list[ClientAllocation] = []

    def alloc(tag: str, nbytes: int) -> ClientAllocation:
        made.append(ClientAllocation(tag, nbytes))
        return made[-1]

    yield alloc
    for a in made:
        a.path.unlink(missing_ok=True)


def _load(root: str) -> m.LoadModel:
    version = Path(root) / "double" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    shutil.copy(fake_cuda.__file__, version / "fake_cuda.py")
    return m.LoadModel("double", str(version.parent), "1", json.dumps(CONFIG), "python", "double_0", "GPU", 0)


async def test_client_region_in_and_out_on_the_device(env, sim):
    inst = env.instance(_load(env.models))
    await inst.start()
    a_in, a_out = sim("in", N * 4), sim("out", N * 4)
    x = np.arange(N, dtype=np.float32)
    x.tofile(a_in.path)
    shm = ClientShm(cuda=CudaRegions(IpcDevice), cuda_probe=True)
    shm.register("cuda", "in", raw_handle=a_in.handle, device_id=0, byte_size=N * 4)
    shm.register("cuda", "out", raw_handle=a_out.handle, device_id=0, byte_size=N * 4)

    span = shm.read("in", 0, N * 4, device_ok=True)
    req = InferRequest("double", id="t", inputs=[Tensor("INPUT0", "FP32", [N], span)],
                       outputs=[RequestedOutput("OUTPUT0"), RequestedOutput("ON_GPU")], device_outputs=True)
    result = await asyncio.wait_for(inst.execute([req]), 60)
    (resp,) = result.responses
    outs = {t.name: t for t in resp.outputs}
    assert np.frombuffer(outs["ON_GPU"].data, dtype=np.bool_)[0], "the model got its input on the device"
    y = outs["OUTPUT0"]
    assert y.device_ref is not None, "the model's device output came back by IPC handle"
    shm.write("out", 0, y.device_ref)  # what the frontends do for an output in a CUDA region
    np.testing.assert_array_equal(a_out.array(), x * 2)
    assert shm.cuda.is_open(a_in.handle)
    del req, span, result, resp, outs, y
    gc.collect()
    shm.unregister("cuda")
    assert not shm.cuda.is_open(a_in.handle) and not cuda_ipc._opened  # the supervisor's mappings are gone


async def test_cpu_instance_gets_a_host_copy(env, sim):
    load = _load(env.models)
    inst = env.instance(m.LoadModel(load.model_name, load.model_dir, load.version, load.config_json, load.backend,
                                    load.instance_name, "CPU", 0))
    await inst.start()
    a_in = sim("cin", 64)
    np.arange(16, dtype=np.float32).tofile(a_in.path)
    shm = ClientShm(cuda=CudaRegions(IpcDevice), cuda_probe=True)
    shm.register("cuda", "cin", raw_handle=a_in.handle, device_id=0, byte_size=64)
    span = shm.read("cin", 0, 64, device_ok=True)
    req = InferRequest("double", id="t", inputs=[Tensor("INPUT0", "FP32", [16], span)],
                       outputs=[RequestedOutput("ON_GPU")])
    result = await asyncio.wait_for(inst.execute([req]), 60)
    (resp,) = result.responses
    assert not np.frombuffer(resp.outputs[0].data, dtype=np.bool_)[0], "a CPU instance gets host bytes"
    shm.unregister("cuda")
