"""kill -9 (and abort / os._exit(0)) of a worker during a request: the request fails within 1 s with
UNAVAILABLE naming the instance, pid and cause; the other instance keeps serving; the killed one is
restarted and serves again; no zombie is left."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from inferd.supervisor.instances.instance import InstanceState
from inferd.worker.wire.errors import ErrorCode, InferdError

from .harness import StateWatch, alive, output, request, write_model


async def test_sigkill_mid_request(env):
    watch = StateWatch()
    a = env.instance(write_model(env.models, "sleep", instance=0), on_change=watch)
    b = env.instance(write_model(env.models, "sleep", instance=1))
    await asyncio.gather(a.start(), b.start())
    victim = a.pid
    slow = asyncio.ensure_future(a.execute([request("sleep", [5.0])]))
    other = asyncio.ensure_future(b.execute([request("sleep", [0.5])]))
    await asyncio.sleep(0.3)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(slow, 5)
    assert time.monotonic() - killed_at < 1.0
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert f"instance 'sleep_0' (pid {victim}) died: killed by signal 9 (SIGKILL)" in info.value.message
    assert not alive(victim)  # reaped: not even a zombie
    result = await asyncio.wait_for(other, 5)  # the other instance is unaffected
    assert output(result.responses[0])[0] == 0.5
    await watch.wait(a, InstanceState.READY, timeout=5)
    assert a.pid != victim and a.restarts == 1
    result = await a.execute([request("sleep", [0.0])])
    assert output(result.responses[0], "PID")[0] == a.pid


@pytest.mark.parametrize("crash,cause", [("abort", "killed by signal 6 (SIGABRT)"), ("exit0", "exited with code 0")])
async def test_crash_from_model_code(env, crash, cause):
    watch = StateWatch()
    inst = env.instance(write_model(env.models, "crashy"), on_change=watch)
    await inst.start()
    pid = inst.pid
    with pytest.raises(InferdError) as info:
        await asyncio.wait_for(inst.execute([request("crashy", [0.0], crash=crash)]), 5)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert f"(pid {pid}) died: {cause}" in info.value.message  # a clean exit nobody asked for is a crash
    await watch.wait(inst, InstanceState.READY, timeout=5)
    result = await inst.execute([request("crashy", [0.0])])
    assert output(result.responses[0], "PID")[0] == inst.pid != pid
