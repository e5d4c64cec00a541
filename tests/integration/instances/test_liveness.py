"""supervisor/instances/liveness.py against real processes: stopped, busy (CPU in a C call holding
the GIL) and stalled (blocked holding the GIL) are told apart from /proc alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from inferd.supervisor.instances import liveness
from inferd.supervisor.instances.liveness import Verdict

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")

BUSY = "import itertools\nwhile True:\n    sum(itertools.repeat(1, 10 ** 9))\n"
BLOCKED = "import ctypes\nctypes.PyDLL(None).pause()\n"


@pytest.fixture
def child():
    procs = []

    def start(code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code])
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def verdict_after(pid: int, window: float, deadline: float = 10.0) -> Verdict:
    """Look as the heartbeat loop does (every 50 ms) until something other than WATCHING comes."""
    probe = liveness.Probe(pid, window)
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        v = probe.check(time.monotonic())
        if v is not Verdict.WATCHING:
            return v
        time.sleep(0.05)
    return Verdict.WATCHING


def test_process_state_and_cpu(child):
    p = child("import time; time.sleep(60)")
    deadline = time.monotonic() + 10
    while liveness.process_state(p.pid) != "S" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert liveness.process_state(p.pid) == "S"
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while liveness.process_state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert liveness.process_state(p.pid) == "T"
    assert liveness.process_state(2 ** 22 + 12345) is None
    assert liveness.cpu_ns(os.getpid()) > 0


def test_stopped(child):
    p = child("import time; time.sleep(60)")
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while liveness.process_state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert verdict_after(p.pid, 0.3) is Verdict.STOPPED


def test_busy_holding_the_gil(child):
    p = child(BUSY)
    assert verdict_after(p.pid, 0.3) is Verdict.BUSY


def test_blocked_holding_the_gil_is_stalled(child):
    p = child(BLOCKED)
    time.sleep(0.5)  # past the interpreter's start-up CPU
    t0 = time.monotonic()
    assert verdict_after(p.pid, 0.3) is Verdict.STALLED
    assert time.monotonic() - t0 >= 0.3  # one whole window without CPU progress


def test_gone_process_is_left_to_the_exit_watcher(child):
    p = child("pass")
    p.wait()  # reaped: no /proc entry
    probe = liveness.Probe(p.pid, 0.1)
    probe.available = True
    assert probe.check(time.monotonic()) is Verdict.WATCHING
