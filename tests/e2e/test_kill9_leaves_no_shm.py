"""kill -9 of the supervisor leaves nothing in /dev/shm (issue 18 item 8), with no next start to sweep:
every region (the supervisor's pool, the workers' output arenas) is unlinked as soon as it is created
and lives only while a process holds it (wire/shm.py)."""

from __future__ import annotations

import os

import numpy as np
import psutil
import pytest

pytestmark = pytest.mark.inferd_only

httpclient = pytest.importorskip("tritonclient.http")

MODEL = "identity_fp32"


def named(pids: set[int]) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm")
                  if n.startswith("inferd_") and n.split("_")[1].isdigit() and int(n.split("_")[1]) in pids)


def mapped(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [line.rsplit("/dev/shm/", 1)[1].strip() for line in f if "/dev/shm/inferd_" in line]


def test_kill_9_of_the_supervisor_leaves_no_shared_memory(server_factory, harness):
    server = server_factory([MODEL])
    workers = set(server.worker_pids(MODEL))
    pids = {server.pid, *workers}
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    try:
        data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB in (a pool region) and out (a worker's region)
        inp = httpclient.InferInput("INPUT0", [data.size], "FP32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()
    # the pool region: the supervisor's, or with --frontend-processes N > 1 a frontend process's (mapped by the
    # supervisor, or on the direct path by the frontend alone, which also maps the worker's output region)
    frontends = {p.pid for p in psutil.Process(server.pid).children()
                 if "frontend_processes.frontend_main" in " ".join(p.cmdline())}
    held = mapped(server.pid) + [name for pid in frontends for name in mapped(pid)]
    pools = {server.pid} | frontends
    pids |= frontends
    assert any(int(n.split("_")[1]) in pools for n in held), held  # its pool region
    assert any(int(n.split("_")[1]) not in pools for n in held), held  # a worker's output region
    assert named(pids) == [], "regions are unlinked at creation"
    server.kill()
    harness.wait_for(lambda: not any(harness.pid_alive(p) for p in workers | frontends), 10.0,
                     "workers and frontend processes to exit")
    assert named(pids) == []
