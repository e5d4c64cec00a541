"""Do this machine's CPUs add up? Times a fixed single-threaded workload pinned to the first CPU,
alternately alone and with a busy loop pinned to the second CPU. On independent cores the times match;
on CPUs that share a core (SMT siblings, or vCPUs a host runs on one core) the workload slows down
while the other CPU is busy, and a server, its workers and the load generator compete for one core.

    .venv/bin/python bench/cpu_share.py            # one line per case; --json for scripts

Linux only (sched_setaffinity). The workload is pure Python (JSON, regex and string work, as a request
path does), so it measures what the interpreter gets.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time

DOC = {"id": "x", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
PATH = re.compile(r"/v2/models/([^/]+)/infer")


def workload(n: int) -> int:
    total = 0
    for i in range(n):
        doc = json.loads(json.dumps(DOC))
        match = PATH.match("/v2/models/m%d/infer" % i)
        assert match is not None
        total += len(doc["inputs"][0]["data"]) + len(match.group(1)) + len("%s-%d" % (doc["id"], i))
    return total


def timed(n: int) -> float:
    t0 = time.perf_counter()
    workload(n)
    return time.perf_counter() - t0


def spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8, help="alone / with a busy CPU pairs")
    ap.add_argument("-n", type=int, default=20_000, help="workload iterations per timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("one CPU: nothing to compare")
        return 0
    os.sched_setaffinity(0, {cpus[0]})
    workload(args.n)  # warm-up
    alone: list[float] = []
    busy: list[float] = []
    for _ in range(args.rounds):
        alone.append(timed(args.n))
        spinner = mp.Process(target=spin, args=(cpus[1],), daemon=True)
        spinner.start()
        time.sleep(0.1)  # let it start spinning
        try:
            busy.append(timed(args.n))
        finally:
            spinner.kill()
            spinner.join(5)
    ratio = statistics.median(b / a for a, b in zip(alone, busy))
    if args.json:
        print(json.dumps({"cpus": cpus, "alone_s": alone, "busy_s": busy, "median_ratio": ratio}))
        return 0
    print(f"CPU {cpus[0]} alone: median {statistics.median(alone) * 1e3:.1f} ms "
          f"({min(alone) * 1e3:.1f}-{max(alone) * 1e3:.1f})")
    print(f"CPU {cpus[0]} while CPU {cpus[1]} spins: median {statistics.median(busy) * 1e3:.1f} ms "
          f"({min(busy) * 1e3:.1f}-{max(busy) * 1e3:.1f})")
    print(f"slow-down while the other CPU is busy (median of {args.rounds} back-to-back pairs): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
