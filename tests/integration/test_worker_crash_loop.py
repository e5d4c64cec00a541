"""A worker that keeps dying after it became ready (a poison request): it is always restarted, the
backoff doubling (0.1 → 0.2 → 0.4 → 0.4 s, capped). A worker that keeps failing to start: after 5
failed restarts in a row the instance is FAILED with the last reason and nothing more is spawned."""

from __future__ import annotations

import os
import signal
import time

import pytest
from inferd.supervisor.instances.instance import InstanceState
from inferd.worker.wire.errors import InferdError

from .harness import TIMINGS, StateWatch, output, request, write_model


def started(load) -> int:
    with open(os.path.join(load.model_dir, "STARTED")) as f:
        return len(f.read().split())


async def test_execute_exits_every_time(env):
    watch = StateWatch()
    load = write_model(env.models, "crashloop")
    inst = env.instance(load, on_change=watch)
    await inst.start()
    crashes = 2 * TIMINGS.restart_give_up
    for n in range(crashes):
        await watch.wait(inst, InstanceState.READY, timeout=5)
        result = await inst.execute([request("crashloop", [float(-n)])])  # it serves between crashes
        assert output(result.responses[0])[0] == -n
        with pytest.raises(InferdError, match="exited with code 0"):
            await inst.execute([request("crashloop", [0.0], crash="exit0")])
    await watch.wait(inst, InstanceState.READY, timeout=5)
    assert watch.count(InstanceState.FAILED) == 0
    assert inst.restarts == crashes and started(load) == crashes + 1 and inst.start_failures == 0
    # the gap between each death and the replacement being ready is at least the backoff delay
    deaths = [t for t, s, _ in watch.history if s is InstanceState.RESTARTING]
    readies = [t for t, s, _ in watch.history if s is InstanceState.READY][1:]
    delays = [min(TIMINGS.restart_cap_s, TIMINGS.restart_base_s * 2 ** n) for n in range(crashes)]
    for (died, ready), delay in zip(zip(deaths, readies, strict=True), delays, strict=True):
        assert ready - died >= delay - 0.05
    result = await inst.execute([request("crashloop", [5.0e-3])])
    assert output(result.responses[0])[0] == pytest.approx(5.0e-3)


async def test_poison_then_failing_starts_gives_up(env):
    """Deaths after ready do not count towards giving up, but the backoff they built up carries on;
    once restarts fail to start, 5 failed starts in a row give up."""
    watch = StateWatch()
    load = write_model(env.models, "poisoned")
    inst = env.instance(load, on_change=watch)
    await inst.start()
    for _ in range(3):
        await watch.wait(inst, InstanceState.READY, timeout=5)
        with pytest.raises(InferdError):
            await inst.execute([request("poisoned", [0.0], crash="kill")])
    await watch.wait(inst, InstanceState.READY, timeout=5)
    with open(os.path.join(load.model_dir, "FAIL_INIT"), "w") as f:
        f.write("weights gone")
    with pytest.raises(InferdError):
        await inst.execute([request("poisoned", [0.0], crash="kill")])
    await watch.wait(inst, InstanceState.FAILED, timeout=15)
    assert inst.start_failures == TIMINGS.restart_give_up and "weights gone" in inst.last_error.message
    assert started(load) == 4


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
    assert elapsed >= 0.1 + 0.2 + 0.4 + 0.4 + 0.4 - 0.1  # backoff before each of the 5 failed restarts
    assert inst.start_failures == 5 and inst.restarts == 5 and started(load) == 1
    assert "the disk ate my weights" in inst.last_error.message
    assert inst.pid is None
