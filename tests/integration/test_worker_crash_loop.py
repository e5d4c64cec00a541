"""A worker that keeps dying: restarts back off (0.1 → 0.2 → 0.4 → 0.4 s, capped), and after 5
failures in a row the instance is FAILED with the last reason and nothing more is spawned."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from inferd.supervisor.instances.instance import InstanceState
from inferd.worker.wire.errors import InferdError

from .harness import TIMINGS, StateWatch, request, write_model


def started(load) -> int:
    with open(os.path.join(load.model_dir, "STARTED")) as f:
        return len(f.read().split())


async def test_execute_exits_every_time(env):
    watch = StateWatch()
    load = write_model(env.models, "crashloop")
    inst = env.instance(load, on_change=watch)
    await inst.start()
    for _ in range(TIMINGS.restart_give_up):
        await watch.wait(inst, InstanceState.READY, timeout=5)
        with pytest.raises(InferdError, match="exited with code 0"):
            await inst.execute([request("crashloop", [0.0], crash="exit0")])
    await watch.wait(inst, InstanceState.FAILED, timeout=5)
    assert inst.failures == 5 and inst.restarts == 4 and started(load) == 5
    assert "exited with code 0" in inst.last_error.message
    # the gap between each death and the replacement being ready is at least the backoff delay
    deaths = [t for t, s, _ in watch.history if s is InstanceState.RESTARTING]
    readies = [t for t, s, _ in watch.history if s is InstanceState.READY][1:]
    for (died, ready), delay in zip(zip(deaths, readies, strict=False), [0.1, 0.2, 0.4, 0.4], strict=True):
        assert ready - died >= delay - 0.05
    with pytest.raises(InferdError, match=r"not ready \(failed\): .*exited with code 0"):
        await inst.execute([request("crashloop", [0.0])])
    await asyncio.sleep(1.0)  # longer than the capped delay: still nothing spawned
    assert started(load) == 5 and inst.pid is None


async def test_initialize_fails_after_first_start(env):
    watch = StateWatch()
    load = write_model(env.models, "initfail")
    inst = env.instance(load, on_change=watch)
    await inst.start()
    with open(os.path.join(load.model_dir, "FAIL_INIT"), "w") as f:
        f.write("the disk ate my weights")
    t0 = time.monotonic()
    os.kill(inst.pid, signal.SIGKILL)
    await watch.wait(inst, InstanceState.FAILED, timeout=15)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.1 + 0.2 + 0.4 + 0.4 - 0.1  # backoff between the 4 failed restarts
    assert inst.failures == 5 and inst.restarts == 4 and started(load) == 1
    assert "the disk ate my weights" in inst.last_error.message
    assert inst.pid is None
