"""Soak: a real inferd under mixed traffic for a while, then proof that nothing grew or leaked.

Traffic, each kind from its own thread with unmodified tritonclient, all at once:
- HTTP inferences (identity_fp32, 4 KiB and 256 KiB tensors),
- gRPC inferences (identity_fp32),
- system shared memory: a client region registered, read and written by inferences, and every
  50 iterations unregistered, destroyed and created again,
- decoupled gRPC streams (decoupled_repeat: 8 responses and a final flag per request),
- load/unload cycles of a third model (load, one inference, unload).

Passes when: 0 unexpected errors, the supervisor's RSS grew < 10 MiB (first sample after warm-up
against the last, load stopped), its open fds and the /dev/shm entries of the server's processes are
back to where they were after warm-up, no client region is left. Prints progress every
--progress seconds and a table at the end; --json adds the figures as one JSON object on stdout.

    .venv/bin/python bench/soak.py                   # 10 minutes
    .venv/bin/python bench/soak.py --duration 120 --json

Not part of `make test` (on demand: it runs for minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

ROOT = Path(__file__).resolve().parent.parent
INFERD = Path(sys.executable).parent / "inferd"
RSS_LIMIT_MIB = 10.0
STREAM_N = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_repo(root: Path) -> Path:
    repo = root / "models"
    repo.mkdir()
    shutil.copytree(ROOT / "examples" / "identity_fp32", repo / "identity_fp32")
    shutil.copytree(ROOT / "tests" / "fixtures" / "models" / "decoupled_repeat", repo / "decoupled_repeat")
    shutil.copytree(ROOT / "examples" / "identity_fp32", repo / "cycled")
    cfg = repo / "cycled" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "identity_fp32"', 'name: "cycled"'))
    return repo


class Server:
    def __init__(self, repo: Path, log_path: Path, control_mode: str = "explicit") -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        loads = ["--load-model", "identity_fp32", "--load-model", "decoupled_repeat"] \
            if control_mode == "explicit" else []
        argv = [str(INFERD), "--model-repository", str(repo), "--model-control-mode", control_mode, *loads,
                "--allow-client-shm", "true", "--http-port", str(self.http_port),
                "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port)]
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        self.tree_pids: set[int] = {self.proc.pid}

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"inferd exited with {self.proc.returncode} during start-up")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise SystemExit("inferd not ready in %.0f s" % timeout)

    def sample(self) -> dict[str, Any]:
        """Supervisor RSS/fds/CPU, workers' RSS, and /dev/shm entries of every process of the server."""
        with self.ps.oneshot():
            rss = self.ps.memory_info().rss
            fds = self.ps.num_fds()
            cpu = sum(self.ps.cpu_times()[:2])
        workers = []
        for child in self.ps.children(recursive=True):
            self.tree_pids.add(child.pid)
            with contextlib.suppress(psutil.Error):
                workers.append(child.memory_info().rss)
        return {"rss_mib": rss / 2**20, "fds": fds, "cpu_s": cpu, "workers": len(workers),
                "workers_rss_mib": sum(workers) / 2**20, "shm": len(self.shm_entries())}

    def shm_entries(self) -> list[str]:
        out = []
        for name in os.listdir("/dev/shm"):
            parts = name.split("_")
            if len(parts) >= 3 and parts[0] == "inferd" and parts[1].isdigit() and int(parts[1]) in self.tree_pids:
                out.append(name)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


class Tally:
    def __init__(self) -> None:
        self.ok: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.first_errors: list[str] = []
        self.lock = threading.Lock()

    def good(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.ok[kind] += n

    def bad(self, kind: str, exc: BaseException) -> None:
        with self.lock:
            self.errors[kind] += 1
            if len(self.first_errors) < 10:
                self.first_errors.append(f"{kind}: {exc!r}"[:300])


def http_loop(server: Server, stop: threading.Event, tally: Tally) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    small, big = np.arange(1024, dtype=np.float32), np.random.default_rng(0).random(65536, dtype=np.float32)
    i = 0
    try:
        while not stop.is_set():
            data = big if i % 10 == 0 else small
            i += 1
            try:
                inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
                inp.set_data_from_numpy(data, binary_data=i % 2 == 0)
                out = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
                if not np.array_equal(out, data):
                    raise AssertionError("HTTP output differs from input")
                tally.good("http")
            except Exception as exc:
                tally.bad("http", exc)
    finally:
        client.close()


def grpc_loop(server: Server, stop: threading.Event, tally: Tally) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.arange(4096, dtype=np.float32)
    try:
        while not stop.is_set():
            try:
                inp = grpcclient.InferInput("INPUT0", [data.size], "FP32")
                inp.set_data_from_numpy(data)
                out = client.infer("identity_fp32", [inp], client_timeout=60).as_numpy("OUTPUT0")
                if not np.array_equal(out, data):
                    raise AssertionError("gRPC output differs from input")
                tally.good("grpc")
            except Exception as exc:
                tally.bad("grpc", exc)
    finally:
        client.close()


def shm_loop(server: Server, stop: threading.Event, tally: Tally) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    n = 16384
    nbytes = n * 4
    key_in, key_out = f"/soak_{os.getpid()}_in", f"/soak_{os.getpid()}_out"
    i = 0
    try:
        while not stop.is_set():
            h_in = shm.create_shared_memory_region("soak_in", key_in, nbytes)
            h_out = shm.create_shared_memory_region("soak_out", key_out, nbytes)
            try:
                client.register_system_shared_memory("soak_in", key_in, nbytes)
                client.register_system_shared_memory("soak_out", key_out, nbytes)
                for _ in range(50):
                    if stop.is_set():
                        break
                    i += 1
                    data = np.full(n, float(i), dtype=np.float32)
                    try:
                        shm.set_shared_memory_region(h_in, [data])
                        inp = httpclient.InferInput("INPUT0", [n], "FP32")
                        inp.set_shared_memory("soak_in", nbytes)
                        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
                        out.set_shared_memory("soak_out", nbytes)
                        client.infer("identity_fp32", [inp], outputs=[out])
                        got = shm.get_contents_as_numpy(h_out, np.float32, [n])
                        if not np.array_equal(got, data):
                            raise AssertionError("shm output differs from input")
                        tally.good("shm")
                    except Exception as exc:
                        tally.bad("shm", exc)
            except Exception as exc:
                tally.bad("shm", exc)
            finally:
                with contextlib.suppress(Exception):
                    client.unregister_system_shared_memory("soak_in")
                    client.unregister_system_shared_memory("soak_out")
                shm.destroy_shared_memory_region(h_in)
                shm.destroy_shared_memory_region(h_out)
    finally:
        client.close()


def stream_loop(server: Server, stop: threading.Event, tally: Tally) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        while not stop.is_set():
            try:
                inp = grpcclient.InferInput("IN", [1], "INT32")
                inp.set_data_from_numpy(np.array([STREAM_N], dtype=np.int32))
                client.async_stream_infer("decoupled_repeat", [inp], enable_empty_final_response=True)
                got = []
                while True:
                    result, error = results.get(timeout=60)
                    if error is not None:
                        raise error
                    final = result.get_response().parameters["triton_final_response"].bool_param
                    out = result.as_numpy("OUT")
                    if out is not None:
                        got.append(int(out[0]))
                    if final:
                        break
                if got != list(range(STREAM_N)):
                    raise AssertionError(f"stream answered {got}")
                tally.good("stream")
                tally.good("stream_responses", len(got))
            except Exception as exc:
                tally.bad("stream", exc)
    finally:
        client.stop_stream()
        client.close()


def cycle_loop(server: Server, stop: threading.Event, tally: Tally) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    data = np.arange(8, dtype=np.float32)
    try:
        while not stop.is_set():
            try:
                client.load_model("cycled")
                inp = httpclient.InferInput("INPUT0", [8], "FP32")
                inp.set_data_from_numpy(data)
                if not np.array_equal(client.infer("cycled", [inp]).as_numpy("OUTPUT0"), data):
                    raise AssertionError("cycled output differs")
                client.unload_model("cycled")
                tally.good("load_unload")
            except Exception as exc:
                tally.bad("load_unload", exc)
            stop.wait(1.0)
    finally:
        client.close()


LOOPS = {"http": http_loop, "grpc": grpc_loop, "shm": shm_loop, "stream": stream_loop, "load_unload": cycle_loop}


def run_traffic(server: Server, seconds: float, tally: Tally, progress: float | None) -> None:
    stop = threading.Event()
    threads = [threading.Thread(target=fn, args=(server, stop, tally), name=name, daemon=True)
               for name, fn in LOOPS.items()]
    for t in threads:
        t.start()
    started = time.monotonic()
    try:
        while not stop.wait(min(progress or seconds, max(0.0, started + seconds - time.monotonic()))):
            elapsed = time.monotonic() - started
            if progress:
                s = server.sample()
                print(f"[{elapsed:6.0f}s] " + " ".join(f"{k}={tally.ok[k]}" for k in LOOPS)
                      + f" errors={sum(tally.errors.values())} rss={s['rss_mib']:.1f}MiB fds={s['fds']}"
                      f" shm={s['shm']} workers={s['workers']}", file=sys.stderr, flush=True)
            if elapsed >= seconds or server.proc.poll() is not None:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(120)


def settle(server: Server, baseline: dict[str, Any], timeout: float = 20.0) -> dict[str, Any]:
    """The last sample, once fds and shm entries are back (connections close asynchronously)."""
    deadline = time.monotonic() + timeout
    s = server.sample()
    while time.monotonic() < deadline and (s["fds"] > baseline["fds"] or s["shm"] > baseline["shm"]):
        time.sleep(0.5)
        s = server.sample()
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of traffic (default 600)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds of traffic before the baseline")
    ap.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (0: none)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (repository, log)")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="inferd-soak-"))
    server = Server(make_repo(scratch), scratch / "server.log")
    try:
        server.wait_ready()
        warm = Tally()
        run_traffic(server, args.warmup, warm, None)  # pools, caches, lazily built paths
        baseline = settle(server, {"fds": 10**9, "shm": 10**9}, 2.0)
        client_shm_start = sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"soak_{os.getpid()}"))
        tally = Tally()
        t0 = time.monotonic()
        run_traffic(server, args.duration, tally, args.progress or None)
        wall = time.monotonic() - t0
        end = settle(server, baseline)
        client_shm_left = sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"soak_{os.getpid()}"))
        alive = server.proc.poll() is None
        rc = server.stop()
    except BaseException:
        server.stop()
        raise
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    shm_after_stop = len(server.shm_entries())

    rss_growth = end["rss_mib"] - baseline["rss_mib"]
    checks = {
        "0 unexpected errors": sum(tally.errors.values()) == 0,
        f"supervisor RSS growth < {RSS_LIMIT_MIB:g} MiB": rss_growth < RSS_LIMIT_MIB,
        "supervisor fds back to start": end["fds"] <= baseline["fds"],
        "server /dev/shm entries back to start": end["shm"] <= baseline["shm"],
        "no client region left": client_shm_left == client_shm_start == [],
        "server alive throughout, exit 0 on SIGTERM": alive and rc == 0,
        "nothing in /dev/shm after stop": shm_after_stop == 0,
    }
    figures = {
        "duration_s": round(wall, 1),
        "requests": dict(tally.ok),
        "rate_per_s": {k: round(v / wall, 1) for k, v in tally.ok.items()},
        "errors": dict(tally.errors),
        "first_errors": tally.first_errors,
        "baseline": {k: round(v, 2) for k, v in baseline.items()},
        "end": {k: round(v, 2) for k, v in end.items()},
        "rss_growth_mib": round(rss_growth, 2),
        "supervisor_cpu_s": round(end["cpu_s"] - baseline["cpu_s"], 1),
        "shm_after_stop": shm_after_stop,
        "exit_code": rc,
        "checks": checks,
        "passed": all(checks.values()),
    }
    rows = [("traffic", ", ".join(f"{k} {v}" for k, v in tally.ok.items())),
            ("errors", str(dict(tally.errors) or 0)),
            ("supervisor RSS (MiB)", f"{baseline['rss_mib']:.1f} -> {end['rss_mib']:.1f} ({rss_growth:+.2f})"),
            ("workers RSS (MiB)", f"{baseline['workers_rss_mib']:.1f} -> {end['workers_rss_mib']:.1f}"),
            ("supervisor fds", f"{baseline['fds']} -> {end['fds']}"),
            ("server /dev/shm entries", f"{baseline['shm']} -> {end['shm']} (after stop: {shm_after_stop})"),
            ("supervisor CPU (s)", f"{end['cpu_s'] - baseline['cpu_s']:.1f} over {wall:.0f} s")]
    rows += [(name, "PASS" if ok else "FAIL") for name, ok in checks.items()]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{a.ljust(width)}  {b}" for a, b in rows), file=sys.stderr)
    for line in tally.first_errors:
        print("  " + line, file=sys.stderr)
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
