"""WorkerProcess against a fake worker: handshake, execute (frames and shm), failures, stop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import replace

import numpy as np
import psutil
import pytest
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances.launcher import Launcher
from inferd.supervisor.instances.worker import WorkerProcess, WorkerState
from inferd.supervisor.memory.shm_pool import ShmPool
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import FAKE_WORKER, FAST

LOAD = m.LoadModel("fake", "/nonexistent", "1", "{}", "python", "fake_0", "CPU")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def make(channel, launcher, timings=FAST, **kw) -> WorkerProcess:
    return WorkerProcess(name="fake_0", model_name="fake", channel=channel, launcher=launcher,
                         timings=timings, **kw)


def req(value: float = 1.0, **params) -> InferRequest:
    data = np.array([value], dtype=np.float32).tobytes()
    return InferRequest("fake", id="r", inputs=[Tensor("X", "FP32", [1], data)], parameters=params)


def mode_launcher(run_dir: str, mode: str) -> Launcher:
    env = dict(os.environ, FAKE_MODE=mode)
    return Launcher(run_dir, command=[sys.executable, "-s", FAKE_WORKER], base_env=env)


async def test_start_execute_stop(channel, fake_launcher):
    pool = ShmPool(max_bytes=64 << 20)
    w = make(channel, fake_launcher, pool=pool)
    try:
        await w.start(LOAD)
        assert w.state is WorkerState.READY and w.hello is not None and w.hello.pid == w.pid
        big = np.arange(100_000, dtype=np.float32)  # 400 kB: goes through shared memory
        r = InferRequest("fake", id="a", inputs=[
            Tensor("X", "FP32", [1], np.array([3], dtype=np.float32).tobytes()),
            Tensor("BIG", "FP32", [100_000], memoryview(big.tobytes())),
        ])
        result = await w.execute([r, req(7.0)])
        assert (result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns) == (1, 2, 3)
        first, second = result.responses
        assert not isinstance(first, InferdError) and not isinstance(second, InferdError)
        assert first.id == "a" and [t.name for t in first.outputs] == ["OUT_X", "OUT_BIG"]
        assert isinstance(first.outputs[1].data, memoryview)
        assert np.array_equal(np.frombuffer(first.outputs[1].data, np.float32), big)
        assert np.frombuffer(second.outputs[0].data, np.float32)[0] == 7.0
        assert pool.in_use_bytes == 0 and pool.region_count == 1
        # a region unlinked by the pool is reported to the worker on its next Execute
        pool.trim(0)
        result = await w.execute([req(1.0)])
        assert result.responses[0].parameters == {"seen": 0}
    finally:
        pid = w.pid
        await w.stop()
        pool.close()
    assert w.state is WorkerState.STOPPED and w.returncode == 0 and gone(pid)


async def test_wire_version_mismatch(channel, run_dir):
    w = make(channel, mode_launcher(run_dir, "bad_version"))
    with pytest.raises(InferdError, match="wire version 99"):
        await w.start(LOAD)
    assert w.state is WorkerState.FAILED and w.exited and gone(w.pid)


async def test_spawn_timeout(channel, run_dir):
    w = make(channel, mode_launcher(run_dir, "no_hello"), replace(FAST, spawn_timeout_s=0.5))
    t0 = time.monotonic()
    with pytest.raises(InferdError, match="timed out after 0.5 s"):
        await w.start(LOAD)
    assert time.monotonic() - t0 < 3 and w.exited and gone(w.pid)


async def test_load_failure_reason(channel, run_dir):
    w = make(channel, mode_launcher(run_dir, "load_fail"))
    with pytest.raises(InferdError, match="fake load failure") as info:
        await w.start(LOAD)
    assert info.value.code == ErrorCode.INTERNAL and w.exited and gone(w.pid)


async def test_death_during_start(channel, run_dir):
    launcher = Launcher(run_dir, command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    w = make(channel, launcher)
    with pytest.raises(InferdError, match="died during start-up: exited with code 3"):
        await w.start(LOAD)


@pytest.mark.parametrize("how", ["sigkill", "exit0"])
async def test_death_mid_request_fails_at_once(channel, fake_launcher, how):
    exits = []
    w = make(channel, fake_launcher, on_exit=lambda w, err: exits.append(err))
    await w.start(LOAD)
    pid = w.pid
    if how == "sigkill":
        task = asyncio.ensure_future(w.execute([req(sleep=30)]))
        await asyncio.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        expect = "killed by signal 9 (SIGKILL)"
    else:
        task = asyncio.ensure_future(w.execute([req(exit=0)]))
        expect = "exited with code 0"
    t0 = time.monotonic()
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - t0 < 1.0
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert f"instance 'fake_0' (pid {pid}) died: {expect}" in info.value.message
    assert w.state is WorkerState.FAILED and len(exits) == 1 and gone(pid)
    with pytest.raises(InferdError, match="died"):
        await w.execute([req()])


async def test_hung_worker_is_killed(channel, fake_launcher):
    died = asyncio.Event()
    w = make(channel, fake_launcher, on_exit=lambda w, err: died.set())
    await w.start(LOAD)
    task = asyncio.ensure_future(w.execute([req(sleep=30)]))
    await asyncio.sleep(0.05)
    os.kill(w.pid, signal.SIGSTOP)
    await asyncio.wait_for(died.wait(), 3)
    with pytest.raises(InferdError, match="hung: no heartbeat"):
        await task
    assert w.returncode == -signal.SIGKILL and gone(w.pid)


async def test_missing_heartbeats_mean_hung(channel, run_dir):
    died = asyncio.Event()
    w = make(channel, mode_launcher(run_dir, "no_heartbeat"), on_exit=lambda w, err: died.set())
    await w.start(LOAD)  # the watchdog starts after Hello
    await asyncio.wait_for(died.wait(), 3)
    assert "hung" in w.error.message


async def test_batches_are_serialized_and_cancel_is_forwarded(channel, fake_launcher):
    w = make(channel, fake_launcher)
    w.max_inflight = 1
    await w.start(LOAD)
    try:
        slow = asyncio.ensure_future(w.execute([req(sleep=0.3)]))
        await asyncio.sleep(0.05)
        assert w.busy and w.inflight == 1
        quick = asyncio.ensure_future(w.execute([req(2.0)]))
        await asyncio.sleep(0.05)
        assert not quick.done()
        slow.cancel()  # the worker still finishes it; the queued one runs afterwards
        result = await asyncio.wait_for(quick, 5)
        assert np.frombuffer(result.responses[0].outputs[0].data, np.float32)[0] == 2.0
        assert not w.busy
    finally:
        await w.stop()


async def test_stop_kills_unresponsive_worker(channel, fake_launcher):
    w = make(channel, fake_launcher)
    await w.start(LOAD)
    os.kill(w.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    await w.stop(0.3)
    assert time.monotonic() - t0 < 2 and w.returncode == -signal.SIGKILL and w.state is WorkerState.STOPPED


async def test_autocomplete(channel, fake_launcher):
    w = make(channel, fake_launcher)
    out = await w.autocomplete(m.AutoComplete("fake", "/x", "1", "{}", "python"))
    assert out == '{"done":1}' and w.exited and w.returncode == 0


async def test_pipeline_sends_batches_ahead_in_order(channel, fake_launcher):
    w = make(channel, fake_launcher)
    w.max_inflight = 2
    await w.start(LOAD)
    try:
        first = asyncio.ensure_future(w.execute([req(1.0, sleep=0.2)]))
        second = asyncio.ensure_future(w.execute([req(2.0)]))
        third = asyncio.ensure_future(w.execute([req(3.0)]))
        await asyncio.sleep(0.05)
        assert w.busy and w.inflight == 2 and not third.done()  # two sent, the third waits for a slot
        results = await asyncio.wait_for(asyncio.gather(first, second, third), 5)
        values = [np.frombuffer(r.responses[0].outputs[0].data, np.float32)[0] for r in results]
        assert values == [1.0, 2.0, 3.0]
        assert not w.busy and w.inflight == 0
    finally:
        await w.stop()
