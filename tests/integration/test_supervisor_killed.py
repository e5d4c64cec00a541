"""kill -9 of the process that owns workers: its workers exit within 3 s (PDEATHSIG, stdin EOF) and
a restarted supervisor's sweep removes the shared memory the dead one left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
from inferd.supervisor.memory.shm_pool import ShmPool

from .harness import alive, our_shm

HERE = os.path.dirname(os.path.abspath(__file__))


def test_workers_die_with_their_supervisor_and_shm_is_swept(tmp_path):
    owner = subprocess.Popen([sys.executable, os.path.join(HERE, "owner_process.py"), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line, "owner process failed to start its workers"
        info = json.loads(line)
        workers = info["workers"]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        assert our_shm(owner.pid) == info["shm"] != []
        owner.kill()
        owner.wait()
        procs = []
        for pid in workers:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(procs, timeout=3)
        assert not [p for p in still if alive(p.pid)], "workers outlived their supervisor"
        # what kill -9 left behind is swept at the next start (another supervisor starting on this
        # machine meanwhile may have swept it already: either way it must be gone afterwards)
        left = our_shm(owner.pid)
        assert set(left) <= set(info["shm"])
        removed = ShmPool.sweep_stale()
        assert set(left) <= set(removed) and our_shm(owner.pid) == []
        shutil.rmtree(info["run_dir"], ignore_errors=True)
    finally:
        if owner.poll() is None:
            owner.send_signal(signal.SIGKILL)
            owner.wait()
