"""A stand-in supervisor for test_supervisor_killed.py: starts two workers of a sleep model, leaves
a request with a shared-memory input in flight, prints {"workers": [...], "shm": [...]} and waits
to be killed. Usage: python owner_process.py <models dir>"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile

import numpy as np
from inferd.supervisor.instances.channel import Channel
from inferd.supervisor.instances.instance import Instance
from inferd.supervisor.instances.launcher import Launcher
from inferd.supervisor.memory.shm_pool import ShmPool

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import TIMINGS, request, write_model  # noqa: E402


async def main(models: str) -> None:
    run_dir = tempfile.mkdtemp(prefix="inferd-o")
    channel = Channel(run_dir)
    channel.open()
    launcher = Launcher(run_dir)
    pool = ShmPool()
    instances = [Instance(write_model(models, "owned", instance=k), channel=channel, launcher=launcher,
                          timings=TIMINGS, pool=pool) for k in range(2)]
    await asyncio.gather(*(i.start() for i in instances))
    big = np.zeros(1 << 18, dtype=np.float32)
    big[0] = 60.0  # sleeps a minute: in flight when we are killed
    asyncio.ensure_future(instances[0].execute([request("owned", big)]))
    while not pool.in_use_bytes:
        await asyncio.sleep(0.01)
    print(json.dumps({"workers": [i.pid for i in instances], "shm": pool.names, "run_dir": run_dir}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
