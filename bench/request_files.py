"""The inferd source files one HTTP and one gRPC inference pass through in the supervisor
(docs/architecture.md quotes the counts; issue 36 asks for at most 12 each).

Serves examples/add_sub with a real inferd server whose process runs under cProfile, sends it add_sub
requests with unmodified tritonclient (HTTP, then gRPC; keep-alive, c=1), and, for each protocol, lists the
files of `supervisor/` and `worker/` (the supervisor imports `worker/wire/`) holding a function called at
least once per request while `--requests` requests ran. The profile is switched on after a warm-up and
off before the next protocol (SIGUSR1 / SIGUSR2 to the server), so start-up and the other protocol do not
count. The worker process is not profiled: docs/architecture.md names the files of the instance hop.

    .venv/bin/python bench/request_files.py [--requests 400] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def serve(argv: list[str], dump_dir: str) -> int:
    """Run the server in this process; SIGUSR1 starts a profile, SIGUSR2 writes it to dump_dir/<n>.prof."""
    state: dict[str, Any] = {"profile": None, "count": 0}

    def start(_sig: int, _frame: Any) -> None:
        state["profile"] = cProfile.Profile()
        state["profile"].enable()

    def stop(_sig: int, _frame: Any) -> None:
        profile = state["profile"]
        if profile is None:
            return
        profile.disable()
        state["profile"] = None
        tmp = os.path.join(dump_dir, f"{state['count']}.tmp")
        profile.dump_stats(tmp)
        os.rename(tmp, os.path.join(dump_dir, f"{state['count']}.prof"))
        state["count"] += 1

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from inferd.supervisor.main import main as server_main
    return server_main(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def files_per_request(prof: str, requests: int) -> dict[str, float]:
    files: dict[str, float] = {}
    for (path, _line, _name), (_cc, ncalls, *_rest) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        m = re.search(r"/((?:supervisor|worker)/.+\.py)$", path)
        if m and ncalls >= requests:
            files[m.group(1)] = max(files.get(m.group(1), 0.0), ncalls / requests)
    return files


def measure(requests: int, warmup: int) -> dict[str, dict[str, float]]:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    work = Path(tempfile.mkdtemp(prefix="request_files_"))
    repo, dumps = work / "repo", work / "dumps"
    dumps.mkdir()
    repo.mkdir()
    shutil.copytree(ROOT / "examples" / "add_sub", repo / "add_sub")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [sys.executable, __file__, "--serve", str(dumps), "--", "--model-repository", str(repo),
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    results: dict[str, dict[str, float]] = {}
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        deadline = time.monotonic() + 120
        while True:
            try:
                if http.is_model_ready("add_sub"):
                    break
            except Exception:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not become ready: {server.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(0.1)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        data = np.arange(16, dtype=np.float32)
        for proto, client, mod in (("http", http, httpclient), ("grpc", grpc, grpcclient)):
            inputs = [mod.InferInput(n, [16], "FP32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(data)
            for _ in range(warmup):
                client.infer("add_sub", inputs)
            server.send_signal(signal.SIGUSR1)
            time.sleep(0.5)  # the handler runs at the server's next bytecode; nothing is sent meanwhile
            for _ in range(requests):
                client.infer("add_sub", inputs)
            n = len(results)
            server.send_signal(signal.SIGUSR2)
            prof = dumps / f"{n}.prof"
            deadline = time.monotonic() + 60
            while not prof.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("the server wrote no profile")
                time.sleep(0.05)
            results[proto] = files_per_request(str(prof), requests)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        sep = sys.argv.index("--")
        return serve(sys.argv[sep + 1:], sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per protocol while profiled")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--json", action="store_true", help="print {protocol: {file: calls per request}}")
    args = ap.parse_args()
    results = measure(args.requests, args.warmup)
    if args.json:
        print(json.dumps(results, indent=1, sort_keys=True))
        return 0
    for proto, files in results.items():
        print(f"{proto}: {len(files)} files on the path of every request")
        for name in sorted(files):
            print(f"  {files[name]:8.1f} calls/request  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
