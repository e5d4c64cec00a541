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
    try:
        os.kill(victim, signal.SIGCONT)  # the old pid is gone
    except ProcessLookupError:
        pass
    result = await inst.execute([request("hangs", [0.0])])
    assert output(result.responses[0], "PID")[0] == inst.pid
