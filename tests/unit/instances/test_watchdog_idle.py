"""liveness.Watchdog's pace (issue 41 item 5): an idle worker is pinged rarely (so that it sleeps), one with
work every interval, and a hang is measured from the moment work is sent, not from the idle worker's last
answer. No process here (pid None: a silent worker is hung after the limit): the verdicts from /proc are
tested in test_liveness.py."""

from __future__ import annotations

import asyncio

import pytest
from inferd.supervisor.instances import liveness

INTERVAL, MISSES = 0.05, 4  # L = 0.2 s


class FakeWorker:
    """Answers each ping at once while `answering`; `working` is what the watchdog asks."""

    def __init__(self) -> None:
        self.answering = True
        self.working = False
        self.pings: list[float] = []
        self.killed: list[tuple[float, str]] = []
        self.dog: liveness.Watchdog | None = None

    def ping(self, seq: int) -> None:
        loop = asyncio.get_running_loop()
        self.pings.append(loop.time())
        if self.answering:
            loop.call_soon(self.dog.heard)

    def make(self) -> liveness.Watchdog:
        async def settle() -> None:
            await asyncio.sleep(0)

        self.dog = liveness.Watchdog(
            pid=None, interval_s=INTERVAL, misses=MISSES, starting_silence_s=0.0, ping=self.ping, settle=settle,
            starting=lambda: False, kill=lambda reason: self.killed.append((asyncio.get_running_loop().time(), reason)),
            who=lambda: "w", working=lambda: self.working)
        return self.dog


@pytest.fixture
def idle_probe(monkeypatch):
    monkeypatch.setattr(liveness, "IDLE_PROBE_S", 0.5)
    return 0.5


async def test_an_idle_worker_is_pinged_once_a_period_a_working_one_every_interval(idle_probe):
    w = FakeWorker()
    dog = w.make()
    assert dog.idle_probe_s == idle_probe
    exited = asyncio.Event()
    task = asyncio.ensure_future(dog.run(exited))
    await asyncio.sleep(1.6)
    idle = len(w.pings)
    w.working = True
    await asyncio.sleep(0.5)
    working = len(w.pings) - idle
    exited.set()
    await asyncio.wait_for(task, 2)
    assert idle <= 4, w.pings  # every 0.5 s (the interval would have given ~32)
    assert working >= 5, w.pings  # every 0.05 s once it has work
    assert not w.killed


async def test_a_hang_is_measured_from_the_moment_work_is_sent(idle_probe):
    w = FakeWorker()
    dog = w.make()
    exited = asyncio.Event()
    task = asyncio.ensure_future(dog.run(exited))
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.75)  # idle, answered a ping or so ago
    w.answering = False
    w.working = True  # work sent to a worker that hangs at once
    sent = loop.time()
    await asyncio.wait_for(task, 5)
    (when, reason), = w.killed
    assert "hung: no heartbeat" in reason
    # L (0.2 s) from the work, within a tick or two; not the idle allowance (0.5 + 0.2 s from the last answer)
    assert when - sent < 0.2 + 3 * INTERVAL + 0.15, (when - sent, reason)
    assert when - sent >= 0.2 - INTERVAL, (when - sent, reason)


async def test_an_idle_worker_that_stops_answering_is_hung_after_the_period_plus_l(idle_probe):
    w = FakeWorker()
    w.answering = False
    dog = w.make()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(dog.run(asyncio.Event()), 5)
    (when, reason), = w.killed
    assert "hung: no heartbeat" in reason
    assert 0.5 + 0.2 - INTERVAL <= when - t0 < 0.5 + 0.2 + 0.5, when - t0
