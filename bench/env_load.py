"""Per-model environment load times (EXECUTION_ENV_PATH) and server responsiveness during an unpack.

Builds (or reuses) the test conda-pack env (CPython 3.10 + numpy 2.2 + pyzmq, ~44 MB, envs/packer.py),
starts inferd in explicit mode with an empty --env-cache-dir, then measures:
  first load  : POST load of a model with that env (hash + unpack + conda-unpack + probe + worker ready)
  reload      : unload, load again in the same server (cache hit)
  new server  : a second server process on the same cache loads the model (cache hit, fresh process)
  health      : GET /v2/health/live latencies polled back-to-back while the first load unpacks

    .venv/bin/python bench/env_load.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.execenv.helpers import (  # noqa: E402
    CACHE,
    ENV_PACKAGES,
    add_report_model,
    pyenv_python,
)


def post(url: str) -> tuple[int, float]:
    t0 = time.monotonic()
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, time.monotonic() - t0


def start(repo: Path, cache: Path, port: int) -> subprocess.Popen[bytes]:
    argv = [str(ROOT / ".venv/bin/inferd"), "--model-repository", str(repo), "--model-control-mode", "explicit",
            "--http-port", str(port), "--grpc-port", str(port + 1), "--metrics-port", str(port + 2),
            "--http-address", "127.0.0.1", "--env-cache-dir", str(cache)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def one_run(tarball: str, port: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="inferd-envbench-"))
    try:
        repo = work / "repo"
        repo.mkdir()
        add_report_model(repo, "m", tarball)
        cache = work / "cache"
        base = f"http://127.0.0.1:{port}"
        proc = start(repo, cache, port)
        lat: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                t0 = time.monotonic()
                with urllib.request.urlopen(base + "/v2/health/live", timeout=5) as r:
                    r.read()
                lat.append(time.monotonic() - t0)
                time.sleep(0.005)

        th = threading.Thread(target=poll)
        th.start()
        try:
            _, first = post(base + "/v2/repository/models/m/load")
        finally:
            done.set()
            th.join()
        post(base + "/v2/repository/models/m/unload")
        _, reload = post(base + "/v2/repository/models/m/load")
        stop(proc)
        proc = start(repo, cache, port)
        _, fresh = post(base + "/v2/repository/models/m/load")
        stop(proc)
        lat.sort()
        return {"first_load_s": first, "reload_s": reload, "new_server_load_s": fresh,
                "health_n": len(lat), "health_p50_ms": 1000 * lat[len(lat) // 2],
                "health_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
                "health_max_ms": 1000 * lat[-1]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=18300)
    a = ap.parse_args()
    from inferd.envs import packer

    base = pyenv_python("3.10.*", "python3.10")
    if base is None:
        raise SystemExit("needs a pyenv CPython 3.10")
    env = packer.build_cached(base, CACHE, ENV_PACKAGES)
    runs = [one_run(env["tarball"], a.port) for _ in range(a.runs)]
    summary = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    print(json.dumps({"tarball_bytes": os.path.getsize(env["tarball"]), "runs": runs, "median": summary,
                      "commit": commit, "machine": f"{platform.node()} {os.cpu_count()} cpu",
                      "date": time.strftime("%Y-%m-%d %H:%M")}, indent=1))


if __name__ == "__main__":
    main()
