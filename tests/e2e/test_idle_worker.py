"""Idle cost (issue 41 item 5): an idle worker sleeps until there is work or a liveness check.

A worker used to wake ~16 times a second while idle (its heartbeat thread polled with a 100 ms cap and sent
every 0.5 s through libzmq's I/O thread). Now it answers the supervisor's pings only, and the supervisor
pings an idle worker every max(1 s, L) (L = interval x misses: 2 s by default): at most 1 wake-up a second,
measured here from the kernel's context-switch counts of every thread of the real worker processes.
A worker stopped while idle is still found hung by those rare pings, and work sent to an idle worker still
gets its answer.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

pytestmark = [pytest.mark.inferd_only,  # worker pids from /v2/inferd/status
              pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")]

DEFAULT_TIMINGS = ["--heartbeat-interval", "0.5", "--heartbeat-misses", "4"]  # the defaults (L = 2 s)
WINDOW_S = 6.0
BOUND = 1.5  # wake-ups a second (the measured rate is ~0.5; the bound leaves room for a busy host)


def wakeups(pid: int) -> int:
    """Voluntary + nonvoluntary context switches so far, summed over every thread of `pid`."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split(":")[1])
        except OSError:
            continue  # a thread that just ended
    return total


def infer(server, model: str, value: float) -> np.ndarray:
    client = server.http_client()
    inp = httpclient.InferInput("INPUT0", [3], "FP32")
    inp.set_data_from_numpy(np.full(3, value, dtype=np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def idle_pids(server, models: list[str]) -> list[int]:
    def check():
        insts = [i for m in models for i in server.instances(m)]
        if len(insts) == len(models) and all(i.get("state") == "ready" and not i.get("inflight") for i in insts):
            return [i["pid"] for i in insts]
        return None

    return server.wait_until(check, 10, "idle ready workers")


def test_idle_workers_wake_at_most_once_a_second(server_factory):
    models = ["idle_a", "idle_b"]
    server = server_factory({m: "identity_fp32" for m in models}, inferd_args=DEFAULT_TIMINGS)
    for i, model in enumerate(models):  # used once: idle after work, not only after start
        np.testing.assert_array_equal(infer(server, model, float(i)), np.full(3, float(i), dtype=np.float32))
    pids = idle_pids(server, models)
    time.sleep(2.5)  # let one idle period pass: the last answer's traffic is over (a measurement window)
    before = {pid: wakeups(pid) for pid in pids}
    t0 = time.monotonic()
    time.sleep(WINDOW_S)  # the measurement itself: a window of wall time
    after = {pid: wakeups(pid) for pid in pids}
    elapsed = time.monotonic() - t0
    rates = {pid: (after[pid] - before[pid]) / elapsed for pid in pids}
    assert all(rate <= BOUND for rate in rates.values()), f"idle wake-ups per second by worker pid: {rates}"
    # still served at once, by the same processes
    np.testing.assert_array_equal(infer(server, "idle_a", 7.0), np.full(3, 7.0, dtype=np.float32))
    assert sorted(i["pid"] for m in models for i in server.instances(m)) == sorted(pids)


def test_a_worker_stopped_while_idle_is_found_hung(server_factory):
    server = server_factory({"idle_c": "identity_fp32"}, inferd_args=DEFAULT_TIMINGS)
    infer(server, "idle_c", 1.0)
    (victim,) = idle_pids(server, ["idle_c"])
    os.kill(victim, signal.SIGSTOP)
    try:
        # the idle pings (every 2 s) go unanswered: hung after the idle period plus L, then replaced
        server.wait_until(lambda: [i for i in server.instances("idle_c")
                                   if i.get("state") == "ready" and i.get("pid") not in (None, victim)],
                          20, "the stopped idle worker to be replaced")
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "hung: no heartbeat for" in server.log_tail() and "(process stopped)" in server.log_tail()
    np.testing.assert_array_equal(infer(server, "idle_c", 2.0), np.full(3, 2.0, dtype=np.float32))
