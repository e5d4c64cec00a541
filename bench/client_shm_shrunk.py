"""Served figures for hostile client shared memory: a real server (examples/identity_fp32,
--allow-client-shm) and tritonclient over HTTP. For 4 KiB and 1 MiB inputs, the latency of a request
reading a healthy registered region, then of one reading the same region after the client truncated it to
0 (a 400 naming the region; before the fix the supervisor died of SIGBUS), and the supervisor's RSS at the
start, after the healthy requests and after the failing ones.

Usage: .venv/bin/python bench/client_shm_shrunk.py [--port 18400] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
MODEL = "identity_fp32"


def start(port: int) -> tuple[subprocess.Popen, str]:
    repo = tempfile.mkdtemp(prefix="bench-cshm-")
    shutil.copytree(ROOT / "examples" / MODEL, Path(repo) / MODEL)
    inferd = Path(sys.executable).parent / "inferd"
    proc = subprocess.Popen([str(inferd), "--model-repository", repo, "--http-port", str(port),
                             "--grpc-port", str(port + 1), "--metrics-port", str(port + 2),
                             "--allow-client-shm", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, repo
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    proc, repo = start(args.port)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{args.port}", network_timeout=30)
    sup = psutil.Process(proc.pid)
    try:
        print("| input | healthy region: p50 / p99 ms | shrunk to 0: p50 / p99 ms (400)"
              " | supervisor RSS: start → after the healthy → after the 400s |")
        print("|---|---|---|---|")
        for label, n in (("4 KiB", 1 << 10), ("1 MiB", 1 << 18)):
            key = f"/bench_shrunk_{uuid.uuid4().hex[:8]}"
            fd = os.open("/dev/shm" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, n * 4)
                os.pwrite(fd, np.arange(n, dtype=np.float32).tobytes(), 0)
                client.register_system_shared_memory("r", key, n * 4)
                inp = httpclient.InferInput("INPUT0", [n], "FP32")
                inp.set_shared_memory("r", n * 4)
                rss0 = sup.memory_info().rss
                ok, bad = [], []
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    client.infer(MODEL, [inp])
                    ok.append((time.perf_counter() - t0) * 1000)
                rss_ok = sup.memory_info().rss
                os.ftruncate(fd, 0)
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    try:
                        client.infer(MODEL, [inp])
                        raise SystemExit("a shrunk region was read")
                    except InferenceServerException as exc:
                        assert exc.status() == "400" and "'r'" in exc.message(), exc
                    bad.append((time.perf_counter() - t0) * 1000)
                rss1 = sup.memory_info().rss
                client.unregister_system_shared_memory("r")

                def p(xs: list[float]) -> str:
                    xs = sorted(xs)
                    return f"{statistics.median(xs):.2f} / {xs[int(len(xs) * 0.99) - 1]:.2f}"

                print(f"| {label} | {p(ok)} | {p(bad)} | {rss0 / 2**20:.1f} → {rss_ok / 2**20:.1f}"
                      f" → {rss1 / 2**20:.1f} MiB |")
            finally:
                os.close(fd)
                os.unlink("/dev/shm" + key)
        assert proc.poll() is None, "the server died"
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
