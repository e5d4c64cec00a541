"""Idle cost of a worker (issue 41 item 5): context switches per second of idle worker processes.

Starts `inferd` on a repository of N copies of examples/identity_fp32 (one KIND_CPU instance each), waits
until every worker is ready and has been idle for a moment, then sums voluntary + nonvoluntary context
switches over every thread of each worker (/proc/<pid>/task/*/status) across the window: each one is a
wake-up (a thread put back on a CPU).

    .venv/bin/python bench/idle_wakeups.py [--models 4] [--seconds 10] [-- extra inferd flags]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "identity_fp32"


def switches(pid: int) -> dict[str, int]:
    """Context switches so far of each thread of `pid` (thread name -> voluntary + nonvoluntary)."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        count = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        out[f"{fields['Name'].strip()}[{tid}]"] = count
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("extra", nargs="*", help="more inferd flags (after --)")
    args = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="idle-repo-"))
    for i in range(args.models):
        dst = repo / f"idle{i}"
        shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
        cfg = dst / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace('name: "identity_fp32"', f'name: "idle{i}"'))
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    argv = [str(Path(sys.executable).parent / "inferd"), "--model-repository", str(repo),
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--http-address", "127.0.0.1", *args.extra]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while time.monotonic() < deadline:
            try:
                status = _get(f"http://127.0.0.1:{http}/v2/inferd/status")
                pids = [i["pid"] for mdl in status.get("models", []) for i in mdl.get("instances", [])
                        if i.get("state") == "ready" and i.get("pid")]
            except OSError:
                pass
            if len(pids) == args.models:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"workers not ready: {pids}")
        time.sleep(2.0)  # start-up traffic over
        before = {pid: switches(pid) for pid in pids}
        t0 = time.monotonic()
        time.sleep(args.seconds)  # all workers measured over the same window
        after = {pid: switches(pid) for pid in pids}
        elapsed = time.monotonic() - t0
        rates = []
        for pid in pids:
            per = {name: (n - before[pid].get(name, 0)) / elapsed for name, n in after[pid].items()}
            rates.append(sum(per.values()))
            busy = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v > 0)
            print(f"worker pid {pid}: {rates[-1]:.2f} wake-ups/s ({busy or 'none'})")
        print(f"mean {sum(rates) / len(rates):.2f} wake-ups/s per idle worker over {args.seconds:g} s "
              f"({args.models} workers)")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(repo, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
