"""64 concurrent requests to `scale` (examples/python_api/batched.py) with the asyncio client; prints the
batch sizes the server's dynamic batcher formed."""

import asyncio
import collections

import numpy as np
from inferd.pytriton.client import AsyncioModelClient


async def main() -> None:
    async with AsyncioModelClient("http://localhost:8000", "scale") as client:
        results = await asyncio.gather(*(client.infer_sample(np.full(3, i, np.float32)) for i in range(64)))
    print("Y[0] of the first 4:", [float(r["Y"][0]) for r in results[:4]])
    print("batch sizes seen (size: requests):", dict(collections.Counter(int(r["SIZE"][0]) for r in results)))


asyncio.run(main())
