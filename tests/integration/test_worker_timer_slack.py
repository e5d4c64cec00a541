"""Workers ask Linux for exact timers (worker/main.py `tighten_timer_slack`): a model's timed waits
are not stretched by the default 50 µs slack on every execute."""

from __future__ import annotations

import os

import pytest

from .harness import request, write_model


async def test_worker_timers_have_no_slack(env):
    inst = env.instance(write_model(env.models, "slack"))
    await inst.start()
    path = f"/proc/{inst.pid}/timerslack_ns"
    if not os.path.exists(path):
        pytest.skip("this kernel does not show a process's timer slack")
    with open(path) as f:
        assert int(f.read()) == 1
    result = await inst.execute([request("slack", [1.0])])  # and it serves as before
    assert len(result.responses) == 1
