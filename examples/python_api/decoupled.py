"""A decoupled model written as a generator: every `yield` is one response, streamed to the client at once.

    python examples/python_api/decoupled.py
    python - <<'PY'
    import numpy as np
    from inferd.pytriton.client import DecoupledModelClient
    with DecoupledModelClient("grpc://localhost:8001", "countdown") as client:
        for response in client.infer_sample(np.array([5], np.int32)):
            print(response["LEFT"])
    PY
"""

import time

import numpy as np
from inferd.pytriton.model_config import ModelConfig, Tensor
from inferd.pytriton.triton import Triton


def countdown(requests):
    start = int(requests[0]["START"][0])
    for left in range(start, -1, -1):
        yield [{"LEFT": np.array([left], dtype=np.int32)}]  # one dict per request
        time.sleep(0.1)


with Triton() as triton:
    triton.bind(
        model_name="countdown",
        infer_func=countdown,
        inputs=[Tensor(name="START", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="LEFT", dtype=np.int32, shape=(1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    triton.serve()
