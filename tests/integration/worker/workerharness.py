"""A fake supervisor for worker tests: raw pyzmq ROUTER + the staging PYTHONPATH of the protocol doc.

Also usable by hand: `python tests/integration/worker/workerharness.py [python]` prints spawn-to-Hello and
idle RSS of a worker started with that interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq
from inferd.worker.wire import messages as m

WORKER_PKG = Path(__file__).resolve().parents[3] / "worker"


def make_pypath(root: Path) -> Path:
    """`<root>/pypath` as docs/worker-protocol.md describes it: inferd/__init__.py (empty),
    inferd/worker -> the worker package, triton_python_backend_utils.py -> the pb_utils shim."""
    pypath = root / "pypath"
    (pypath / "inferd").mkdir(parents=True, exist_ok=True)
    (pypath / "inferd" / "__init__.py").write_text("")
    link = pypath / "inferd" / "worker"
    if not link.exists():
        link.symlink_to(WORKER_PKG, target_is_directory=True)
    pb = pypath / "triton_python_backend_utils.py"
    if not pb.exists():
        pb.symlink_to(WORKER_PKG / "compat" / "triton_python_backend_utils.py")
    return pypath


def worker_env(pypath: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CONDA_"))}
    env["PYTHONPATH"] = str(pypath)
    env["PYTHONNOUSERSITE"] = "1"
    return env


class FakeSupervisor:
    def __init__(self, python: str = sys.executable) -> None:
        self.python = os.path.abspath(python) if os.sep in python else python
        # short directory: ipc:// paths are limited to ~107 bytes
        self.dir = Path(tempfile.mkdtemp(prefix="inferd-wt-", dir="/tmp"))
        self.pypath = make_pypath(self.dir)
        self.endpoint = "ipc://%s/sup.sock" % self.dir
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.endpoint)
        self.procs: list[subprocess.Popen] = []
        self.heartbeats: dict[str, int] = {}

    def spawn(self, identity: str, hb_interval: float = 0.2, hb_timeout: float = 0.0,
              extra: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [self.python, "-s", "-m", "inferd.worker"], stdin=subprocess.PIPE, env=worker_env(self.pypath),
            cwd=str(self.dir),
        )
        self.procs.append(proc)
        boot = {
            "wire_version": m.WIRE_VERSION, "endpoint": self.endpoint, "identity": identity,
            "instance_name": identity, "supervisor_pid": os.getpid(), "heartbeat_interval_s": hb_interval,
            "heartbeat_timeout_s": hb_timeout, "log_verbose": 1,
        }
        boot.update(extra or {})
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(boot) + "\n").encode())
        proc.stdin.flush()
        return proc

    def recv(self, timeout: float = 10.0) -> tuple[str, Any, list]:
        """Next message from a main socket (heartbeats are counted and skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(left * 1000)):
                raise TimeoutError("no message from the worker within %.1f s" % timeout)
            parts = self.router.recv_multipart(copy=False)
            ident = parts[0].bytes.decode()
            msg, frames = m.decode(parts[1:])
            if ident.endswith("/hb"):
                self.heartbeats[ident] = self.heartbeats.get(ident, 0) + 1
                continue
            return ident, msg, list(frames)

    def ping(self, identity: str, seq: int, timeout: float = 10.0) -> None:
        """Send Heartbeat(seq) to the worker's heartbeat socket and wait for its answer (the same seq)."""
        self.send(identity + "/hb", m.Heartbeat(seq))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(left * 1000)):
                raise TimeoutError("no heartbeat answer from %s within %.1f s" % (identity, timeout))
            parts = self.router.recv_multipart(copy=False)
            msg, _ = m.decode(parts[1:])
            if parts[0].bytes.decode() == identity + "/hb" and msg == m.Heartbeat(seq):
                self.heartbeats[identity + "/hb"] = self.heartbeats.get(identity + "/hb", 0) + 1
                return

    def expect(self, cls: type, timeout: float = 10.0) -> tuple[Any, list]:
        ident, msg, frames = self.recv(timeout)
        assert isinstance(msg, cls), "expected %s, got %r" % (cls.__name__, msg)
        return msg, frames

    def send(self, identity: str, message: Any, frames: list | tuple = ()) -> None:
        self.router.send_multipart([identity.encode(), *m.encode(message, frames)], copy=False)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)
            if proc.stdin:
                proc.stdin.close()
        self.router.close(0)
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)


def rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


if __name__ == "__main__":  # measure spawn-to-Hello and idle RSS
    sup = FakeSupervisor(sys.argv[1] if len(sys.argv) > 1 else sys.executable)
    try:
        times = []
        for i in range(5):
            t0 = time.perf_counter()
            proc = sup.spawn("w%d" % i)
            hello, _ = sup.expect(m.Hello)
            times.append(time.perf_counter() - t0)
            time.sleep(0.3)
            print("spawn->Hello %.0f ms, idle RSS %d KiB, python %s numpy %s"
                  % (times[-1] * 1000, rss_kib(proc.pid), hello.python_version, hello.numpy_version))
            sup.send("w%d" % i, m.Shutdown())
            sup.expect(m.Bye)
            proc.wait(5)
        print("median spawn->Hello %.0f ms" % (sorted(times)[len(times) // 2] * 1000))
    finally:
        sup.close()
