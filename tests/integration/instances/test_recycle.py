"""Recycling (instances/recycle.py, Instance.recycle) against the fake worker: the replacement is ready
before the old worker stops taking work, the old one answers what it holds, the instance never leaves
READY; max_requests and max_age trigger it; a replacement that fails to start leaves the old one serving;
the settings' syntax and the model parameters over the server's defaults."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from inferd.supervisor.config import WorkerTimings
from inferd.supervisor.instances import recycle
from inferd.supervisor.instances.instance import Instance, InstanceState
from inferd.worker.wire.errors import ErrorCode, InferdError

from .conftest import FAST
from .test_instance import LOAD, Recorder, req


class Swaps(Recorder):
    """Every on_change, and an event per change of the serving pid."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: list[int | None] = []
        self.swapped = asyncio.Event()

    def __call__(self, inst: Instance) -> None:
        super().__call__(inst)
        if inst.pid not in self.pids:
            self.pids.append(inst.pid)
            self.swapped.set()


async def test_recycle_is_ready_before_the_old_worker_stops_and_fails_nothing(channel, fake_launcher):
    rec = Swaps()
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=FAST, on_change=rec)
    await inst.start()
    old = inst.worker
    slow = inst.launch([req(sleep=0.4)])  # on the old worker while it is replaced
    assert await asyncio.wait_for(inst.recycle(), 20) is True
    assert slow.done() and not isinstance(slow.result().responses[0], InferdError)  # answered before it stopped
    assert old.exited and old.returncode == 0 and old.exit_reason == "recycled"
    assert inst.pid not in (None, old.pid) and inst.worker is not old
    assert all(state is InstanceState.READY for _, state in rec.states[1:]), rec.states  # never left READY
    assert inst.restarts == 1 and inst.restart_reasons["recycled"] == 1
    result = await asyncio.wait_for(inst.execute([req()]), 10)
    assert not isinstance(result.responses[0], InferdError)
    await inst.drain_and_stop(5)


async def test_max_requests_recycles_once_per_worker(channel, fake_launcher):
    rec = Swaps()
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=replace(FAST, max_requests=5),
                    on_change=rec)
    await inst.start()
    first = inst.pid
    rec.swapped.clear()
    for _ in range(6):  # past 5 (x up to 1.1): one recycle starts
        await asyncio.wait_for(inst.execute([req()]), 10)
    await asyncio.wait_for(rec.swapped.wait(), 20)
    assert inst.pid != first and inst.restart_reasons["recycled"] == 1
    await inst.drain_and_stop(5)


async def test_max_age_recycles(channel, fake_launcher):
    rec = Swaps()
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=replace(FAST, max_age_s=0.3),
                    on_change=rec)
    await inst.start()
    first = inst.pid
    rec.swapped.clear()
    await asyncio.wait_for(rec.swapped.wait(), 20)
    assert inst.pid != first and inst.restart_reasons["recycled"] >= 1
    await inst.drain_and_stop(5)
    assert inst.state is InstanceState.STOPPED and inst.pid is None


class FailsAfterFirst:
    """A launcher whose second spawn fails (a replacement that cannot start)."""

    def __init__(self, launcher) -> None:
        self.launcher = launcher
        self.spawns = 0

    async def spawn(self, *args, **kwargs):
        self.spawns += 1
        if self.spawns > 1:
            raise InferdError(ErrorCode.UNAVAILABLE, "no more processes")
        return await self.launcher.spawn(*args, **kwargs)


async def test_a_replacement_that_fails_to_start_leaves_the_old_worker_serving(channel, fake_launcher):
    inst = Instance(LOAD, channel=channel, launcher=FailsAfterFirst(fake_launcher), timings=FAST)
    await inst.start()
    first = inst.pid
    assert await asyncio.wait_for(inst.recycle(), 20) is False
    assert inst.ready and inst.pid == first and inst.restarts == 0
    result = await asyncio.wait_for(inst.execute([req()]), 10)
    assert not isinstance(result.responses[0], InferdError)
    await inst.drain_and_stop(5)


async def test_a_drain_during_a_recycle_ends_it_and_stops_the_worker(channel, fake_launcher):
    inst = Instance(LOAD, channel=channel, launcher=fake_launcher, timings=FAST)
    await inst.start()
    old = inst.worker
    recycling = asyncio.ensure_future(inst.recycle())
    await asyncio.sleep(0)  # the replacement's start has begun
    await asyncio.wait_for(inst.drain_and_stop(5), 20)
    assert await asyncio.wait_for(recycling, 5) is False
    assert inst.state is InstanceState.STOPPED and old.exited and inst.pid is None


def test_settings_syntax():
    assert recycle.parse_requests("1000") == 1000
    assert recycle.parse_requests("0") is None and recycle.parse_requests("none") is None
    assert recycle.parse_age("90") == 90.0 and recycle.parse_age("30m") == 1800.0
    assert recycle.parse_age("12h") == 43200.0 and recycle.parse_age("500ms") == 0.5
    assert recycle.parse_age("") is None
    with pytest.raises(ValueError, match="not a request count"):
        recycle.parse_requests("1e3")
    with pytest.raises(ValueError, match="not an age"):
        recycle.parse_age("soon")
    with pytest.raises(ValueError, match="below 100 ms"):
        recycle.parse_age("10ms")


def test_model_parameters_over_the_server_defaults():
    server = WorkerTimings(max_requests=100, max_age_s=60.0)
    assert recycle.model_timings({}, server) is server
    own = recycle.model_timings({"INFERD_MAX_REQUESTS": {"string_value": "5"},
                                 "INFERD_MAX_AGE": {"string_value": "none"}}, server)
    assert own.max_requests == 5 and own.max_age_s is None
    with pytest.raises(ValueError, match="parameter INFERD_MAX_REQUESTS: 'many' is not a request count"):
        recycle.model_timings({"INFERD_MAX_REQUESTS": {"string_value": "many"}}, server)


def test_spread_stays_within_ten_percent():
    assert all(100 <= recycle.spread(100) <= 110 for _ in range(200))
