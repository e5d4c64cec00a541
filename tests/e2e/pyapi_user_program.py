"""A PyTriton-style user program for the crash tests: binds add_sub (large outputs go through the worker's
shared memory), prints READY <supervisor pid>, then serves until killed."""

import sys

import numpy as np
from inferd.pytriton.decorators import batch
from inferd.pytriton.model_config import ModelConfig, Tensor
from inferd.pytriton.triton import Triton, TritonConfig


@batch
def identity(INPUT0):
    return {"OUTPUT0": INPUT0}


http, grpc, metrics = (int(p) for p in sys.argv[1:4])
triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
triton.bind("identity", identity, inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,))], config=ModelConfig(max_batch_size=4))
triton.run()
print("READY", triton._proc.pid if triton._proc else 0, flush=True)  # noqa: SLF001 - the test kills it
triton.serve()
