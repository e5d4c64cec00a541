"""A real worker of a KIND_GPU instance handed a client's CUDA region input (loc "cuda", owner
"client:<region>") it cannot open -- here: no CUDA at all; on a GPU: the client's process is gone --
answers that request with a clear 400-class error and
keeps serving; after the region is unregistered, the next Execute tells it to forget the handle
("cuda:<hex>" in forget_regions) and it goes on serving. The supervisor's region table runs on the fake
device of tests/unit/memory (the real one needs a GPU)."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

import numpy as np
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.memory.client_shm import ClientShm
from inferd.supervisor.memory.cuda_regions import CudaRegions
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .harness import output, request, write_model

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "memory"))
from fake_cuda_device import FakeDevice  # noqa: E402


async def test_gpu_worker_with_an_unopenable_client_handle(env, monkeypatch):
    load = write_model(env.models, "sleep")
    load = m.LoadModel(load.model_name, load.model_dir, load.version, load.config_json, load.backend,
                       load.instance_name, "GPU", 0)
    inst = env.instance(load)
    await inst.start()
    pid = inst.pid
    dev = FakeDevice()
    shm = ClientShm(cuda=CudaRegions(lambda: dev), cuda_probe=True)
    handle = dev.allocate(4096)
    shm.register("cuda", "r", raw_handle=handle, device_id=0, byte_size=4096)
    span = shm.read("r", 0, 16, device_ok=True)
    req = InferRequest("sleep", id="t", inputs=[Tensor("INPUT0", "FP32", [4], span)])
    result = await asyncio.wait_for(inst.execute([req]), 30)
    (err,) = result.responses
    assert isinstance(err, InferdError), err
    assert err.code == ErrorCode.INVALID_ARG
    assert "input 'INPUT0': cannot open CUDA shared memory region 'r'" in err.message
    assert inst.pid == pid  # the worker did not die
    del req, span, result
    gc.collect()
    shm.unregister("cuda", "r")
    assert not shm.cuda.is_open(handle)
    packer = inst._worker._pipeline.packer  # type: ignore[union-attr]
    assert list(packer._cuda_seen) == [handle]
    sent: list[list[str]] = []
    real_header = m.execute_header  # what instances/packing.py writes the Execute with

    def spy(batch_id, items, forget, poll_us=0):
        sent.append(list(forget))
        return real_header(batch_id, items, forget, poll_us)

    monkeypatch.setattr(m, "execute_header", spy)
    result = await asyncio.wait_for(inst.execute([request("sleep", [0.0, 1.0])]), 30)  # carries the forget
    assert sent == [["cuda:" + handle.hex()]] and not packer._cuda_seen
    np.testing.assert_array_equal(output(result.responses[0]), [0.0, 1.0])
    assert inst.pid == pid


