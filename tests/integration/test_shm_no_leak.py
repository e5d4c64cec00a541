"""Shared memory: large inputs go through supervisor-owned regions that are reused, released when a
worker dies mid-request, forgotten by workers once unlinked, and all gone after close. A full
/dev/shm is an UNAVAILABLE error, not a SIGBUS."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest
from inferd.worker.wire.errors import InferdError

from .harness import alive, held_shm, our_shm, output, request, write_model


def mapped_regions(pid: int) -> set[str]:
    return {os.path.basename(m.path).split(" ")[0] for m in psutil.Process(pid).memory_maps(grouped=True)
            if "/dev/shm/inferd_" in m.path}


async def test_regions_reused_released_and_removed(env):
    inst = env.instance(write_model(env.models, "big"))
    await inst.start()
    data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: above the inline limit
    data[0] = 0.0
    for _ in range(20):
        result = await inst.execute([request("big", data)])
        assert np.array_equal(output(result.responses[0]), data)
    assert env.pool.region_count == 1 and env.pool.in_use_bytes == 0
    names = set(held_shm())
    assert names == set(env.pool.names) and our_shm() == []  # held open, never named in /dev/shm
    own = f"inferd_{inst.pid}_o"  # the worker's own regions, for its large outputs (worker/arena.py)
    assert {n for n in mapped_regions(inst.pid) if not n.startswith(own)} == names  # it attached the pool's
    # unlinked regions are dropped from the worker's cache on its next Execute
    env.pool.trim(0)
    assert held_shm() == []
    await inst.execute([request("big", [0.0])])
    assert {n for n in mapped_regions(inst.pid) if not n.startswith(own)} == set()
    # kill -9 while a region is leased: the lease comes back, nothing is left mapped anywhere
    slow = data.copy()
    slow[0] = 5.0
    victim = inst.pid
    pending = asyncio.ensure_future(inst.execute([request("big", slow)]))
    await asyncio.sleep(0.3)
    assert env.pool.in_use_bytes > 0
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(InferdError, match="killed by signal 9"):
        await pending
    assert env.pool.in_use_bytes == 0 and not alive(victim)
    # only the supervisor's own (reusable) region remains, and close removes it
    assert set(held_shm()) == set(env.pool.names)
    env.pool.close()
    assert held_shm() == [] and our_shm() == []
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"inferd_{victim}_")]


SMALL_SHM_SCRIPT = textwrap.dedent("""
    import os
    from inferd.supervisor.memory.shm_pool import ShmPool
    from inferd.worker.wire.errors import InferdError
    pool = ShmPool()
    try:
        pool.lease(16 << 20)
    except InferdError as exc:
        print(exc.code.name, exc.message)
    lease = pool.lease(1 << 20)  # the next small one still works
    lease.write(b"x" * (1 << 20))
    pool.close()
    print("left", [n for n in os.listdir("/dev/shm") if n.startswith("inferd_")])
""")


def test_full_dev_shm_is_an_error_not_sigbus():
    cmd = ["unshare", "-m", "sh", "-c",
           'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, SMALL_SHM_SCRIPT]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("unshare not available")
    if proc.returncode != 0 and ("unshare" in proc.stderr or "mount" in proc.stderr):
        pytest.skip("cannot make a private /dev/shm here: " + proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    assert "INTERNAL shared memory exhausted" in proc.stdout
    assert "left []" in proc.stdout
