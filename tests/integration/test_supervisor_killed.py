"""kill -9 of the process that owns workers: its workers exit within 3 s (PDEATHSIG, stdin EOF) and
no shared memory is left behind, with no sweep: regions are unlinked at creation and live only as
long as a process holds them (wire/shm.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest
from inferd.worker.wire import shm
from inferd.worker.wire.errors import InferdError

from .harness import alive, held_shm, our_shm

HERE = os.path.dirname(os.path.abspath(__file__))


def test_workers_die_with_their_supervisor_and_no_shm_is_left(tmp_path):
    owner = subprocess.Popen([sys.executable, os.path.join(HERE, "owner_process.py"), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line, "owner process failed to start its workers"
        info = json.loads(line)
        workers = info["workers"]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        assert held_shm(owner.pid) == info["shm"] != [] and our_shm(owner.pid) == []
        assert all(our_shm(pid) == [] for pid in workers)
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
        # nothing to sweep: no name was ever left under /dev/shm, and the regions are gone with their holders
        assert our_shm(owner.pid) == [] and all(our_shm(pid) == [] for pid in workers)
        for handle in info["shm"]:
            with pytest.raises(InferdError, match="not found"):
                shm.attach(handle)
        shutil.rmtree(info["run_dir"], ignore_errors=True)
    finally:
        if owner.poll() is None:
            owner.send_signal(signal.SIGKILL)
            owner.wait()
