"""Reloads under a steady closed-loop load (issue 41 item 4): inferd and Triton 2.51 each serve one Python
model (1 ms of work a request, 2 CPU instances) in explicit mode while `--threads` tritonclient HTTP clients
send requests back to back; after a steady phase the model is reloaded `--reloads` times through the load
API, each time with a new config (a changed parameter) or a new version (--kind version: a version
directory added, which replaces the served one under the default `latest 1` policy). Reported per server:
failed requests, and p50/p99 latency in steady state and during the reloads (from a load call's start to its
answer plus `--after-s`), the reload's own duration.

    .venv/bin/python bench/reload.py                       # both servers, config reloads, then version reloads
    .venv/bin/python bench/reload.py --servers inferd --kind config --reloads 3 --no-record

Triton runs from /work/shared/tools/triton_reference.sh (or $INFERD_TRITON_SCRIPT). Appends a section to
bench/RESULTS.md unless --no-record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from closed_loop import Answer, ClosedLoop, fp32_input, percentile  # noqa: E402  (the tests' load)

INFERD = ROOT / ".venv" / "bin" / "inferd"
TRITON = Path(os.environ.get("INFERD_TRITON_SCRIPT", "/work/shared/tools/triton_reference.sh"))
MODEL = ROOT / "tests" / "fixtures" / "models" / "sleep"  # sleeps INPUT0 seconds, answers its PID; 2 instances


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, kind: str, repo: Path, log_path: Path) -> None:
        self.kind = kind
        self.http_port = free_port()
        ports = ["--http-port", str(self.http_port), "--grpc-port", str(free_port()),
                 "--metrics-port", str(free_port())]
        common = ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "sleep",
                  "--http-address", "127.0.0.1", *ports]
        argv = ([str(INFERD), *common] if kind == "inferd"
                else ["bash", str(TRITON), "run", *common, "--allow-gpu-metrics", "false"])
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.kind} exited with {self.proc.returncode} during start-up")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://{self.url}/v2/models/sleep/ready", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise SystemExit(f"{self.kind} not ready in {timeout:.0f} s")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.log.close()


def _reload(server: Server, repo: Path, kind: str, n: int, config: dict[str, Any]) -> None:
    """One reload of the model: a new config (a changed parameter), or a new version directory."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url, network_timeout=300.0)
    try:
        if kind == "config":
            config = dict(config, parameters={"GENERATION": {"string_value": str(n)}})
            client.load_model("sleep", config=json.dumps(config))
        else:
            shutil.copytree(repo / "sleep" / "1", repo / "sleep" / str(n + 2))
            client.load_model("sleep")
    finally:
        client.close()


def run_one(kind_server: str, kind: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    import tritonclient.http as httpclient

    repo = scratch / f"repo-{kind_server}-{kind}"
    shutil.copytree(MODEL, repo / "sleep", ignore=shutil.ignore_patterns("__pycache__"))
    server = Server(kind_server, repo, scratch / f"{kind_server}-{kind}.log")
    try:
        server.wait_ready()
        client = httpclient.InferenceServerClient(server.url)
        config = client.get_model_config("sleep")
        client.close()
        load = ClosedLoop(server.url, "sleep", fp32_input("INPUT0", args.work_ms / 1000), threads=args.threads,
                          pid_output="PID").start()
        time.sleep(args.warmup_s)
        steady_from = time.monotonic()
        time.sleep(args.steady_s)
        steady_to = time.monotonic()
        windows: list[tuple[float, float]] = []
        for n in range(args.reloads):
            start = time.monotonic()
            _reload(server, repo, kind, n, config)
            end = time.monotonic()
            windows.append((start, end + args.after_s))
            time.sleep(args.after_s + args.gap_s)
        answers = load.stop()
    finally:
        server.stop()

    def within(a: Answer, spans: list[tuple[float, float]]) -> bool:
        return any(lo <= a.at < hi for lo, hi in spans)

    steady = [a for a in answers if within(a, [(steady_from, steady_to)])]
    during = [a for a in answers if within(a, windows)]
    ok_steady = [a.latency_s * 1000 for a in steady if not a.error]
    ok_during = [a.latency_s * 1000 for a in during if not a.error]
    errors = sorted({a.error[:160] for a in answers if a.error})
    return {
        "server": kind_server, "kind": kind, "requests": len(answers),
        "failed": sum(1 for a in answers if a.error), "failed_during_reload": sum(1 for a in during if a.error),
        "steady": {"n": len(steady), "p50_ms": percentile(ok_steady, 50), "p99_ms": percentile(ok_steady, 99)},
        "reload": {"n": len(during), "p50_ms": percentile(ok_during, 50), "p99_ms": percentile(ok_during, 99)},
        "reload_s": [round(hi - args.after_s - lo, 3) for lo, hi in windows],
        "errors": errors[:5],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| Server | Reload | Requests | Failed (during reloads) | Steady p50 / p99 ms "
             "| During reload p50 / p99 ms | p99 ratio | Reload took (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, d = r["steady"], r["reload"]
        ratio = d["p99_ms"] / s["p99_ms"] if s["p99_ms"] else float("nan")
        took = ", ".join(f"{t:.2f}" for t in r["reload_s"])
        lines.append(f"| {r['server']} | {r['kind']} | {r['requests']} | {r['failed']} ({r['failed_during_reload']}) "
                     f"| {s['p50_ms']:.2f} / {s['p99_ms']:.2f} (n={s['n']}) | {d['p50_ms']:.2f} / {d['p99_ms']:.2f} "
                     f"(n={d['n']}) | {ratio:.2f}× | {took} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", default="inferd,triton")
    p.add_argument("--kind", default="config,version", help="config, version or both (comma-separated)")
    p.add_argument("--reloads", type=int, default=5)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--work-ms", type=float, default=1.0, help="the model's sleep per request")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--steady-s", type=float, default=10.0)
    p.add_argument("--after-s", type=float, default=1.0, help="the reload window goes on this long after the call")
    p.add_argument("--gap-s", type=float, default=2.0, help="steady time between reloads")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="inferd-reload-") as tmp:
        for kind in args.kind.split(","):
            for server in args.servers.split(","):
                row = run_one(server, kind, args, Path(tmp))
                print(json.dumps(row), flush=True)
                rows.append(row)
    text = table(rows)
    print(text)
    if not args.no_record:
        record(args, rows, text)
    return 0


def record(args: argparse.Namespace, rows: list[dict[str, Any]], text: str) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    load = os.getloadavg()
    errors = [f"- {r['server']} {r['kind']}: " + "; ".join(r["errors"]) for r in rows if r["errors"]]
    section = [
        "", f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — reloads under load (bench/reload.py), "
        f"commit `{commit.strip()}`", "",
        f"- Machine: {os.cpu_count()} vCPUs ({platform.processor() or platform.machine()}), a VM shared with other "
        f"jobs: the host was busy (load average {load[0]:.2f} at the end)",
        f"- Command: `.venv/bin/python bench/reload.py {' '.join(sys.argv[1:])}`",
        f"- Load: {args.threads} tritonclient HTTP threads, closed loop, {args.work_ms:g} ms of work a request, "
        f"model `sleep` (2 CPU instances); {args.reloads} reloads a row, {args.steady_s:g} s steady phase; the reload "
        f"window is a load call's duration plus {args.after_s:g} s", "", text, *([""] + errors if errors else []),
    ]
    with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
        f.write("\n".join(section) + "\n")


if __name__ == "__main__":
    sys.exit(main())
