"""A hung worker (SIGSTOP): the heartbeat watchdog notices within interval x misses, SIGKILLs it,
fails its request with "hung", and the instance restarts and serves; SIGCONT later changes nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from inferd.supervisor.instances.instance import InstanceState
from inferd.worker.wire.errors import ErrorCode, InferdError

from .harness import StateWatch, alive, output, request, write_model


async def test_sigstop_is_detected_killed_and_restarted(env):
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "hangs"), on_change=watch)
    await inst.start()
    victim = inst.pid
    pending = asyncio.ensure_future(inst.execute([request("hangs", [3.0])]))
    await asyncio.sleep(0.1)
    stopped_at = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(pending, 5)
    assert time.monotonic() - stopped_at < 1.5  # 0.1 s x 4 misses, plus one interval of slack
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert f"instance 'hangs_0' (pid {victim}) hung: no heartbeat for" in info.value.message
    assert not alive(victim)
    await watch.wait(inst, InstanceState.READY, timeout=5)
    assert inst.pid != victim
    assert inst.restart_reasons["hung"] == 1 and sum(inst.restart_reasons.values()) == 1
    try:
        os.kill(victim, signal.SIGCONT)  # the old pid is gone
    except ProcessLookupError:
        pass
    result = await inst.execute([request("hangs", [0.0])])
    assert output(result.responses[0], "PID")[0] == inst.pid


# A model that holds the GIL without releasing it: "hold" (seconds) of CPU work in one C call (sum over
# itertools.repeat never returns to the eval loop), or "block": libc pause() called through PyDLL (which
# keeps the GIL), i.e. blocked forever holding the GIL, as in a deadlock with a native lock.
GIL_MODEL = '''
import ctypes, itertools, json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

def hold_gil(seconds):
    t0 = time.perf_counter()
    sum(itertools.repeat(1, 10 ** 7))
    rate = 10 ** 7 / max(time.perf_counter() - t0, 1e-6)
    sum(itertools.repeat(1, int(rate * seconds)))

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            params = json.loads(r.parameters() or "{}")
            if params.get("block"):
                ctypes.PyDLL(None).pause()
            t0 = time.monotonic()
            hold_gil(float(params.get("hold", 0)))
            held = time.monotonic() - t0
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", np.array([held], dtype=np.float32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return out
'''


async def test_busy_worker_holding_the_gil_is_not_killed(env, caplog):
    """Issue 18 item 4: a model in a ~3 s C call that holds the GIL silences the heartbeat thread for
    several times the heartbeat limit (0.4 s); it is busy, not hung: the request succeeds on the same pid."""
    caplog.set_level("INFO", logger="inferd.instances.worker")
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "gil", GIL_MODEL), on_change=watch)
    await inst.start()
    pid = inst.pid
    result = await asyncio.wait_for(inst.execute([request("gil", [0.0], hold=3.0)]), 60)
    # it held the GIL well past 2 x the heartbeat limit (the calibration of the C loop is rough)
    assert output(result.responses[0])[0] >= 1.5
    assert output(result.responses[0], "PID")[0] == pid and inst.pid == pid
    assert inst.restarts == 0 and watch.count(InstanceState.RESTARTING) == 0
    assert "is busy: no heartbeat for" in caplog.text  # the old watchdog would have killed it here
    assert (await inst.execute([request("gil", [0.0])])).responses[0] is not None


async def test_deadlocked_worker_is_detected(env):
    """Blocked for good while holding the GIL (no heartbeat, no CPU): hung after about 2 x 0.4 s."""
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "stuck", GIL_MODEL), on_change=watch)
    await inst.start()
    victim = inst.pid
    t0 = time.monotonic()
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(inst.execute([request("stuck", [0.0], block=1)]), 10)
    assert time.monotonic() - t0 < 3.0
    assert "hung: no heartbeat for" in info.value.message and "no CPU progress" in info.value.message
    assert not alive(victim)
    await watch.wait(inst, InstanceState.READY, timeout=10)
    assert inst.pid != victim
