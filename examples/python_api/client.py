"""Call `add_sub` (examples/python_api/add_sub.py) with the bundled synchronous client, over HTTP and gRPC."""

import numpy as np
from inferd.pytriton.client import ModelClient

a = np.arange(4, dtype=np.float32)
b = np.ones(4, dtype=np.float32)
for url in ("http://localhost:8000", "grpc://localhost:8001"):
    with ModelClient(url, "add_sub") as client:
        print(url, client.infer_sample(a, b))  # one sample; infer_batch sends a batch
