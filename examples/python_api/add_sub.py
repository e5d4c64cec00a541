"""Serve a Python function as model `add_sub` (PyTriton code with `inferd.` in front of its imports).

    python examples/python_api/add_sub.py            # serves on :8000 (HTTP), :8001 (gRPC), :8002 (metrics)
    python examples/python_api/client.py              # calls it
"""

import numpy as np
from inferd.pytriton.decorators import batch
from inferd.pytriton.model_config import ModelConfig, Tensor
from inferd.pytriton.triton import Triton


@batch
def add_sub(INPUT0, INPUT1):
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


with Triton() as triton:
    triton.bind(
        model_name="add_sub",
        infer_func=add_sub,
        inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,)),
                Tensor(name="INPUT1", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(-1,)),
                 Tensor(name="OUTPUT1", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=64),
    )
    triton.serve()  # until Ctrl-C / SIGTERM
