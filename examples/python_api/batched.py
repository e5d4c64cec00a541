"""A batched model with two instances: the server's dynamic batcher groups concurrent requests (up to 32,
waiting at most 2 ms) and the two callables serve batches side by side. `SIZE` reports the batch size the
function saw. Also serves examples/ (a model repository) beside it: both worlds in one server.

    python examples/python_api/batched.py
    python examples/python_api/async_client.py       # 64 concurrent requests
"""

import pathlib

import numpy as np
from inferd.pytriton.decorators import batch
from inferd.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from inferd.pytriton.triton import Triton, TritonConfig


def make_instance():
    @batch
    def scale(X):
        return {"Y": X * 2.0, "SIZE": np.full((len(X), 1), len(X), dtype=np.int32)}

    return scale


config = TritonConfig(model_repository=pathlib.Path(__file__).resolve().parents[1])  # the example models too
with Triton(config=config) as triton:
    triton.bind(
        model_name="scale",
        infer_func=[make_instance(), make_instance()],  # one callable per instance
        inputs=[Tensor(name="X", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="Y", dtype=np.float32, shape=(-1,)), Tensor(name="SIZE", dtype=np.int32, shape=(1,))],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
        strict=True,  # outputs must match the declared dtypes and shapes exactly
    )
    triton.serve()
