"""Instance supervision against a fake worker: restart, backoff, give-up, drain."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
import weakref
from dataclasses import replace

import numpy as np
import pytest
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances.instance import Instance, InstanceState, backoff_delay
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import FAST

LOAD = m.LoadModel("fake", "/nonexistent", "1", "{}", "python", "fake_0", "CPU")


def req(**params) -> InferRequest:
    data = np.ones(1, np.float32).tobytes()
    return InferRequest("fake", inputs=[Tensor("X", "FP32", [1], data)], parameters=params)


class Recorder:
    def __init__(self) -> None:
        self.states: list[tuple[float, InstanceState]] = []
        self.changed = asyncio.Event()

    def __call__(self, inst: Instance) -> None:
        self.states.append((time.monotonic(), inst.state))
        self.changed.set()

    async def wait_for(self, inst: Instance, state: InstanceState, timeout: float = 5.0) -> None:
        async def loop() -> None:
            while inst.state is not state:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), timeout)


def test_backoff_delay():
    assert [backoff_delay(n, 0.25, 2.0) for n in range(6)] == [0.0, 0.25, 0.5, 1.0, 2.0, 2.0]


async def test_restart_after_kill(channel, fake_launcher):
    rec = Recorder()
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=FAST, on_change=rec)
    await inst.start()
    assert inst.ready
    first = inst.pid
    os.kill(first, signal.SIGKILL)
    await rec.wait_for(inst, InstanceState.RESTARTING)
    with pytest.raises(InferdError) as info:
        await inst.execute([req()])
    assert info.value.code == ErrorCode.UNAVAILABLE and "killed by signal 9" in info.value.message
    await rec.wait_for(inst, InstanceState.READY)
    assert inst.pid != first and inst.restarts == 1 and inst.failures == 1
    result = await inst.execute([req()])
    assert not isinstance(result.responses[0], InferdError)
    await inst.drain_and_stop(1)
    assert inst.state is InstanceState.STOPPED and inst.pid is None


async def test_crash_loop_backs_off_and_never_gives_up(channel, fake_launcher):
    """Deaths after ready (poison requests) back off but never count towards giving up."""
    rec = Recorder()
    timings = replace(FAST, restart_base_s=0.05, restart_cap_s=0.2, restart_give_up=3)
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=timings, on_change=rec)
    await inst.start()
    ready_times = []
    for _ in range(6):
        await rec.wait_for(inst, InstanceState.READY)
        ready_times.append(time.monotonic())
        with pytest.raises(InferdError, match="exited with code 7"):
            await inst.execute([req(exit=7)])
    await rec.wait_for(inst, InstanceState.READY)
    assert inst.failures == 6 and inst.restarts == 6 and inst.start_failures == 0
    assert all(s is not InstanceState.FAILED for _, s in rec.states)
    gaps = [b - a for a, b in zip(ready_times, ready_times[1:], strict=False)]
    for gap, delay in zip(gaps, [0.05, 0.1, 0.2, 0.2, 0.2], strict=True):
        assert gap >= delay - 0.03
    assert not isinstance((await inst.execute([req()])).responses[0], InferdError)
    await inst.drain_and_stop(0)


async def test_drain_waits_for_inflight(channel, fake_launcher):
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=FAST)
    await inst.start()
    task = asyncio.ensure_future(inst.execute([req(sleep=0.3)]))
    await asyncio.sleep(0.05)
    assert inst.inflight == 1
    await inst.drain_and_stop(5)
    result = task.result()
    assert not isinstance(result.responses[0], InferdError)
    assert inst.state is InstanceState.STOPPED and inst.worker.returncode == 0


async def test_inflight_counts_batches_waiting_for_a_slot_and_cancelled_ones(channel, fake_launcher):
    """In-flight requests are counted from launch to the end of their future: also a batch waiting for
    a pipeline slot, and one cancelled while it waits or runs; drain then finds the instance idle."""
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=replace(FAST, pipeline_depth=1))
    await inst.start()
    running = inst.launch([req(sleep=0.3)])
    waiting = inst.launch([req(), req(k=1)])  # no slot: waits in the pipeline (unlike requests: no columns)
    cancelled = inst.launch([req()])
    assert inst.inflight == 4
    cancelled.cancel()
    result = await asyncio.wait_for(running, 10)
    assert not isinstance(result.responses[0], InferdError)
    assert len((await asyncio.wait_for(waiting, 10)).responses) == 2
    await asyncio.sleep(0)  # the futures' done callbacks
    assert inst.inflight == 0
    t0 = time.monotonic()
    await inst.drain_and_stop(5)
    assert time.monotonic() - t0 < 2 and inst.state is InstanceState.STOPPED


async def test_drain_timeout_fails_inflight(channel, fake_launcher):
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=replace(FAST, stop_timeout_s=0.2))
    await inst.start()
    task = asyncio.ensure_future(inst.execute([req(sleep=30)]))
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await inst.drain_and_stop(0.1)
    assert time.monotonic() - t0 < 2
    with pytest.raises(InferdError, match="was stopped"):
        await task


async def test_first_start_failure_raises(channel, run_dir):
    import sys

    from inferd.supervisor.instances.launcher import Launcher

    from .conftest import FAKE_WORKER

    env = dict(os.environ, FAKE_MODE="load_fail")
    launcher = Launcher(run_dir, command=[sys.executable, "-s", FAKE_WORKER], base_env=env)
    inst = Instance(LOAD, channel=channel, launcher=launcher, timings=FAST)
    with pytest.raises(InferdError, match="fake load failure"):
        await inst.start()
    assert inst.state is InstanceState.FAILED and inst.pid is None and inst.restarts == 0


async def test_answered_batch_is_counted_out_at_once_and_freed_without_the_gc(channel, fake_launcher):
    """A batch its worker answers leaves the in-flight count as its future resolves (before the future's
    own callbacks run), and nothing of it waits for the cyclic GC: the future is freed with the last
    reference to it."""
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=FAST)
    await inst.start()
    seen: list[int] = []
    fut = inst.launch([req()])
    fut.add_done_callback(lambda _: seen.append(inst.inflight))
    gc.disable()
    try:
        result = await asyncio.wait_for(fut, 10)
        await asyncio.sleep(0)  # the done callback
        assert not isinstance(result.responses[0], InferdError) and seen == [0]
        gone = weakref.ref(fut)
        del fut
        assert gone() is None
    finally:
        gc.enable()
    await inst.drain_and_stop(5)
