"""The worker's heartbeat thread must not take a long GIL hold for a lost supervisor: when it gets
the GIL back, the supervisor's heartbeats that queued up meanwhile are read before it decides
(issue 18 item 4, the worker's side). The supervisor is a separate process here, so that it keeps
sending while this process holds the GIL."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import time

import zmq
from inferd.worker.channel import HeartbeatThread

PEER = r"""
import sys, time, zmq
from inferd.worker.wire import messages as m
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
router.bind(sys.argv[1])
print("bound", flush=True)
seq = 0
while True:
    seq += 1
    try:
        router.send_multipart([b"w9/hb", *m.encode(m.Heartbeat(seq))], flags=zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    while router.poll(0):
        router.recv_multipart()
    time.sleep(0.15)
"""



def test_long_gil_hold_is_not_a_lost_supervisor():
    endpoint = "ipc://" + os.path.join(tempfile.mkdtemp(), "hb.sock")
    peer = subprocess.Popen([sys.executable, "-c", PEER, endpoint], stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    lost: list[str] = []
    thread = HeartbeatThread(ctx, endpoint, "w9", 0.05, 0.5, lost.append)
    try:
        assert peer.stdout.readline().strip() == "bound"
        thread.start()
        deadline = time.monotonic() + 10
        while thread.heard < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert thread.heard >= 2, "no heartbeat from the peer"
        for _ in range(3):
            t0 = time.perf_counter()
            sum(itertools.repeat(1, 10 ** 6))
            n = int(10 ** 6 / max(time.perf_counter() - t0, 1e-6) * 1.2)
            sum(itertools.repeat(1, n))  # ~1.2 s in one C call: over twice the thread's timeout
            time.sleep(0.3)  # the thread runs again and reads what queued up
            assert not lost, lost
    finally:
        thread.stop()
        thread.join(2)
        peer.kill()
        peer.wait()
        ctx.term()
    assert not lost
