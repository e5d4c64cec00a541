"""The inferd source files one HTTP inference passes through (docs/architecture.md quotes the count).

Runs bench/hotpath.py's in-process request path (real HttpConnection, Router, InferCodec, data plane and
DynamicBatcher; a stand-in instance answers) under cProfile for `--rounds` batches and lists each file of
supervisor/ or worker/ holding a function called at least once per round: the files on every request's
path, without those that only ran while setting up. The worker process and the ZeroMQ/shm hop are not in
it (the stand-in instance answers); docs/architecture.md names the files of that hop.

    .venv/bin/python bench/request_files.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import re
import sys
from pathlib import Path

import uvloop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("hotpath", Path(__file__).with_name("hotpath.py"))
    assert spec is not None and spec.loader is not None
    hotpath = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hotpath)
    profiler = cProfile.Profile()
    profiler.enable()
    uvloop.run(hotpath.measure(args.rounds))
    profiler.disable()
    files: dict[str, int] = {}
    for (path, _line, _name), (_cc, ncalls, *_rest) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        m = re.search(r"/((?:supervisor|worker)/.+\.py)$", path)
        if m and ncalls >= args.rounds and "/bench/" not in path:
            files[m.group(1)] = max(files.get(m.group(1), 0), ncalls)
    for name in sorted(files):
        print(f"{files[name] / args.rounds:8.1f} calls/round  {name}")
    print(f"{len(files)} files on the path of every request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
