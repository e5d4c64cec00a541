"""A dynamic-batching model served to the core and a direct peer, whose executes mostly wait: they run on the
merge thread (worker/merged_serving.py) while the main thread holds back, decodes and merges what comes meanwhile,
then answers. A real worker process; the core and the frontend are Channels as in test_direct_peers.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from inferd.worker import merged_serving, thread_busy
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode

from .test_direct_peers import WAIT_S, Side, Worker, attach, config, stop, value

MODEL = """
import json
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        params = json.loads(requests[0].parameters())
        print("model: execute of %d on %s" % (len(requests), threading.current_thread().name), file=sys.stderr,
              flush=True)
        if params.get("wait"):  # a model that waits (a device, a remote call): its thread is idle meanwhile
            time.sleep(params["wait"])
        if params.get("spin"):  # a model that computes for that long
            end = time.thread_time() + params["spin"]
            while time.thread_time() < end:
                pass
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            y = np.array([len(requests) + (100 if request.is_cancelled() else 0)], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y + 0 * x)]))
        return out
"""


@pytest.fixture
def run_dir():
    path = tempfile.mkdtemp(prefix="inferd-ms")  # short: ipc paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def start(run_dir: str, tmp_path: Path) -> tuple[Side, Worker]:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    core = Side(run_dir, "workers.sock").open()
    worker = Worker(run_dir, core.channel.endpoint)
    await core.recv(m.Hello)
    core.send(m.LoadModel("m", str(model_dir), "1", json.dumps(config("m", batching=True)), "python", "m_0", "CPU"))
    loaded, _ = await core.recv(m.LoadResult)
    assert loaded.error is None
    return core, worker


def executes(worker: Worker, start: int) -> list[tuple[int, str]]:
    """(requests, thread name) of each execute() logged from line `start` on."""
    found = [re.search(r"model: execute of (\d+) on (\S+)", line) for line in worker.lines[start:]]
    return [(int(f.group(1)), f.group(2)) for f in found if f]


async def answer(side: Side, batch_id: int) -> list[float]:
    """Each request's OUT[0] (the reply by requests, or by columns when every answer is alike)."""
    result, frames = await side.recv()
    assert result.batch_id == batch_id
    if isinstance(result, m.ExecuteResultColumns):
        return [float(v) for v in np.frombuffer(frames[result.outputs[0].frame], np.float32)]
    assert isinstance(result, m.ExecuteResult)
    return [float(value(result, frames, i)[0]) for i in range(len(result.responses))]


async def merge_thread_busy(fe: Side, worker: Worker, seconds: float) -> int:
    """A first execute that waits (on the main thread: it sends the next ones to the merge thread), then one that
    keeps the merge thread busy for `seconds`; returns the log line it started from (for `executes`)."""
    mark = len(worker.lines)
    fe.execute(1, [1], wait=0.01)
    assert await answer(fe, 1) == [1.0]
    fe.execute(2, [2], wait=seconds)
    await worker.logged("on inferd-merge", mark)
    return mark


async def test_batches_that_come_while_a_waiting_execute_runs_are_merged_and_run_on_the_merge_thread(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        mark = await merge_thread_busy(fe, worker, 0.5)
        # while it runs: batches of both senders, and a Cancel for one of them (read before that batch runs)
        fe.execute(3, [3, 4], wait=0.01)
        core.execute(1, [1], wait=0.01)
        fe.execute(4, [5], wait=0.01)
        fe.send(m.Cancel([4]))  # (read after its batch was decoded for the next execute: it is left out there)
        assert await answer(fe, 2) == [1.0]
        # one execute() of the three requests left, answered to each sender; request 4 answered as cancelled
        result, frames = await fe.recv(m.ExecuteResult)
        assert result.batch_id == 3 and value(result, frames, 0)[0] == 3.0
        # decoded while batch 2 ran for 0.5 s: its compute_input is the decoding's, not that wait
        assert result.compute_input_ns < 200_000_000
        cancelled = result.responses[1]
        assert cancelled.request_id == 4 and cancelled.error is not None
        assert cancelled.error.code == ErrorCode.CANCELLED
        assert await answer(core, 1) == [3.0]
        assert await answer(fe, 4) == [3.0]
        runs = executes(worker, mark)
        assert runs == [(1, "MainThread"), (1, runs[1][1]), (3, runs[2][1])] and runs[1][1].startswith("inferd-merge")
        assert runs[2][1].startswith("inferd-merge")
    finally:
        await stop(core, worker, fe)


async def test_a_cancel_that_comes_before_the_batch_is_decoded_skips_the_request(run_dir, tmp_path):
    """Past max_batch_size a held-back batch waits undecoded: its request cancelled meanwhile never runs."""
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        await merge_thread_busy(fe, worker, 0.5)
        fe.execute(3, list(range(10, 18)), wait=0.01)  # 8: a full batch, decoded for the next execute
        fe.execute(4, [20, 21], wait=0.01)  # no room: held as it came
        fe.send(m.Cancel([21]))
        await answer(fe, 2)
        assert await answer(fe, 3) == [8.0] * 8
        result, frames = await fe.recv(m.ExecuteResult)
        assert result.batch_id == 4
        ran, cancelled = result.responses
        assert value(result, frames, 0)[0] == 1.0  # an execute() of request 20 alone
        assert cancelled.request_id == 21 and cancelled.error is not None
        assert cancelled.error.code == ErrorCode.CANCELLED
    finally:
        await stop(core, worker, fe)


async def test_shutdown_while_the_merge_thread_runs_answers_everything_first(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        await merge_thread_busy(fe, worker, 0.3)
        core.execute(3, [3], wait=0.01)  # (from the core, as the Shutdown: read before it)
        core.send(m.Shutdown())
        assert await answer(core, 3) == [1.0]
        await core.recv(m.Bye)
        assert await answer(fe, 2) == [1.0]
        assert await asyncio.to_thread(worker.proc.wait, 30) == 0
    finally:
        worker.kill()
        for side in (core, fe):
            side.channel.close()


async def test_peers_that_break_or_go_while_the_merge_thread_runs_cost_only_themselves(run_dir, tmp_path):
    """A peer's malformed Execute held back meanwhile drops that peer when it is decoded; a peer that goes away
    while its batch runs gets no answer; the last peer gone, the loop waits for the batch, answers what the core
    sent meanwhile, and serves on."""
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    fe2 = await attach(core, run_dir, "fe-2.sock")
    try:
        mark = await merge_thread_busy(fe, worker, 0.5)
        fe2.send(m.ExecuteColumns(3, ["x"], []))  # malformed: request ids must be ints
        await asyncio.wait_for(fe2.lost.wait(), WAIT_S)
        core.execute(1, [1], wait=0.01)
        fe.channel.close()
        await worker.logged("fe-1.sock dropped", mark)
        assert await answer(core, 1) == [1.0]
        core.execute(2, [2], wait=0.01)
        assert await answer(core, 2) == [1.0]
        assert worker.proc.poll() is None
    finally:
        await stop(core, worker, fe, fe2)


async def test_an_execute_that_computes_stays_on_the_main_thread(run_dir, tmp_path):
    core, worker = await start(run_dir, tmp_path)
    fe = await attach(core, run_dir)
    try:
        mark = len(worker.lines)
        for batch_id in range(1, 4):
            fe.execute(batch_id, [batch_id], spin=0.005)
            await answer(fe, batch_id)
        assert [thread for _, thread in executes(worker, mark)] == ["MainThread"] * 3
    finally:
        await stop(core, worker, fe)


@pytest.mark.parametrize("wall_ms, busy_ms, threaded", [
    (5.0, 0.1, True),  # a sleep, a device, a remote call
    (5.0, 2.4, True),
    (5.0, 3.0, False),  # mostly computing (or waiting for a CPU to compute on): the threads would share the interpreter
    (0.5, 0.0, False),  # short: the hand-off to the thread would cost more than it saves
])
def test_which_executes_go_to_the_merge_thread(wall_ms, busy_ms, threaded):
    assert merged_serving.mostly_waits(int(wall_ms * 1e6), int(busy_ms * 1e6)) is threaded


def test_a_thread_is_busy_while_it_computes_not_while_it_sleeps():
    before = thread_busy.busy_ns()
    time.sleep(0.2)
    slept = thread_busy.busy_ns() - before
    before = thread_busy.busy_ns()
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    spun = thread_busy.busy_ns() - before
    assert slept < 100_000_000, f"asleep for 0.2 s, busy for {slept / 1e6:.1f} ms"
    assert spun >= 20_000_000, f"20 ms on a CPU, busy for {spun / 1e6:.1f} ms"


def test_the_busy_time_descriptor_goes_with_its_thread():
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        thread = threading.Thread(target=thread_busy.busy_ns)
        thread.start()
        thread.join()
    assert len(os.listdir("/proc/self/fd")) == before
