"""Frontend processes (issue 26): throughput against --frontend-processes N, beside Triton 2.51.

    .venv/bin/python bench/scaleout.py                          # N = 1, 2 and Triton; 3 rounds of 10 s
    .venv/bin/python bench/scaleout.py --frontends 1,2,4 --servers inferd -d 5 --rounds 1
    .venv/bin/python bench/scaleout.py --servers inferd-N1,inferd-N2,triton -d 3 --rounds 1 --no-record

Scenarios (closed loop, concurrency --conc, default 64): add_sub over HTTP (wrk, JSON body) and gRPC
(h2load, pre-serialized request; replies checked by bytes as bench/run.py does), and a model whose
execute() costs a fixed 5 ms whatever the batch (bench/models/fixed_cost with `dynamic_batching { }`,
max_batch_size 32) over HTTP. Every server runs at once on its own ports; each round measures every
scenario on every server back to back (A B C A B C), so other load on the host falls on all alike.
Server CPU per request is split into the supervisor's main process ("core"; for Triton, all of
tritonserver), the frontend processes, and the rest (the model workers; Triton's Python stubs), each
read as the process's whole CPU clock (every thread, the exited ones included; children not counted).
The core's µs per request bound what one core can carry whatever N: 1e6 / core µs requests per second.

Prints the measured table (medians over rounds, per-round values in brackets), then the scaling model
(issue 42): from the median µs per request of each class, the requests/s predicted at 4, 16 and 64 cores,
min(C * 1e6 / total µs, 1e6 / core µs), assuming frontends and model instances are added with cores while
the core stays one process (Triton: no serial owner by this measure, so cores are the only bound).
Writes bench/results/scaleout-<date>-<commit>.json (`--no-record` not to) and `--json PATH`, both with
the predictions. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as rb  # noqa: E402  (bench/run.py: servers, wrk, h2load, the gRPC request tool)

BATCHED = "fixed_cost_batched"
MODELS = ("add_sub", "identity_4mib", BATCHED)
SCENARIOS = [("http_add_sub", "http", "add_sub"), ("grpc_add_sub", "grpc", "add_sub"),
             ("http_fixed_5ms_batched", "http", BATCHED)]
CLASSES = ("core", "frontends", "workers")
CORES = (4, 16, 64)
MODEL_HEADER = ("Scaling model: frontend processes and model instances are added with cores, the core stays one "
                "process, so req/s at C cores = min(C * 1e6 / total µs, core ceiling = 1e6 / core µs). "
                "With N=1 the core also parses and encodes (frontends 0). Triton: nothing is serial by this "
                "measure (its main process is multi-threaded), so its only bound is cores. The worker ceiling "
                "(1e6 / worker µs) holds per model instance and grows with the instance count (one instance "
                "here). CPU is what this host's run measured, contention included.")


def serial_class(server: str) -> str | None:
    """The process class owned by one non-replicated process: inferd's core; none for Triton."""
    return "core" if server.startswith("inferd") else None


def predict(cpu_us: dict[str, float], serial: str | None, cores: tuple[int, ...] = CORES) -> dict:
    """Requests/s at each core count from the CPU µs per request of each process class (pure).

    Every class's CPU spreads over the cores (total µs per request); the serial class, one process,
    also caps the rate at 1e6 / its µs whatever the cores. Returns the ceilings and, per core count,
    the rate and its bound ("cores" or the serial class)."""
    total = sum(cpu_us.values())
    ceiling = 1e6 / cpu_us[serial] if serial is not None and cpu_us.get(serial, 0.0) > 0 else None
    workers = cpu_us.get("workers", 0.0)
    out: dict = {"total_us": round(total, 1), "serial_class": serial,
                 "serial_ceiling_per_s": None if ceiling is None else round(ceiling),
                 "worker_ceiling_per_instance_per_s": round(1e6 / workers) if workers > 0 else None,
                 "predicted_per_s": {}, "bound_by": {}}
    for c in cores:
        by_cores = c * 1e6 / total if total > 0 else float("inf")
        capped = ceiling is not None and ceiling < by_cores
        rate = ceiling if capped else by_cores
        out["predicted_per_s"][str(c)] = None if rate == float("inf") else round(rate)
        out["bound_by"][str(c)] = serial if capped else "cores"
    return out


def median_split(points: list[dict]) -> dict[str, float] | None:
    """Median over rounds of each class's µs per request (None when no round measured CPU)."""
    splits = [p["cpu_us_per_request"] for p in points if "cpu_us_per_request" in p and "invalid" not in p]
    if not splits:
        return None
    return {k: statistics.median(sp[k] for sp in splits) for k in CLASSES}


def model_table(points: list[dict], servers: list[str], conc: int, cores: tuple[int, ...] = CORES) -> tuple[str, dict]:
    """The scaling model as a markdown table, and the same figures by scenario and server (for the JSON)."""
    lines = [MODEL_HEADER, "",
             f"| scenario (c={conc}) | server | µs/req core | frontends | workers | total | core ceiling req/s | "
             "worker ceiling req/s per instance | " + " | ".join(f"{c} cores req/s" for c in cores) + " |",
             "|---" * (8 + len(cores)) + "|"]
    out: dict = {}
    for name, _, _ in SCENARIOS:
        for srv in servers:
            split = median_split([p for p in points if p["scenario"] == name and p["server"] == srv])
            if split is None:
                continue
            pred = {"cpu_us_per_request": {k: round(v, 1) for k, v in split.items()},
                    **predict(split, serial_class(srv), cores)}
            out.setdefault(name, {})[srv] = pred
            ceiling, per_instance = pred["serial_ceiling_per_s"], pred["worker_ceiling_per_instance_per_s"]
            cells = []
            for c in cores:  # the rate, and the serial class's name where it, not the cores, is the bound
                rate, bound = pred["predicted_per_s"][str(c)], pred["bound_by"][str(c)]
                cells.append(("—" if rate is None else f"{rate:,}") + ("" if bound == "cores" else f" ({bound})"))
            lines.append(f"| {name} | {srv} | {split['core']:.1f} | {split['frontends']:.1f} | "
                         f"{split['workers']:.1f} | {pred['total_us']:.1f} | "
                         f"{'none (not serial)' if ceiling is None else f'{ceiling:,}'} | "
                         f"{'—' if per_instance is None else f'{per_instance:,}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines), out


def process_cpu_s(proc: rb.psutil.Process) -> float:
    """CPU seconds of one process, all its threads (exited ones too) and none of its children: the kernel's
    per-process CPU clock (nanoseconds), or /proc's user+sys (10 ms ticks) where that clock is refused."""
    try:
        return time.clock_gettime((~proc.pid << 3) | 2)  # Linux CPUCLOCK_SCHED of the whole thread group
    except OSError:
        t = proc.cpu_times()
        return t.user + t.system


def prepare_repo(repo: Path) -> None:
    rb.prepare_repo(repo)  # add_sub, identity_4mib, trivial
    src = rb.BENCH / "models" / "fixed_cost"
    shutil.copytree(src, repo / BATCHED, ignore=shutil.ignore_patterns("__pycache__"))
    text = (src / "config.pbtxt").read_text().replace('name: "fixed_cost"', f'name: "{BATCHED}"')
    (repo / BATCHED / "config.pbtxt").write_text(text + "dynamic_batching { }\n")


class Server(rb.Server):
    """bench/run.py's server, as inferd with N frontend processes ("inferd-N<n>"; "inferd-N<n>-core": with
    --frontend-direct false, every request through the core as before issue 42) or Triton."""

    def command(self, repo: Path) -> tuple[list[str], dict, Path] | str:
        h, g, m = (str(p) for p in self.ports)
        loads = [a for name in MODELS for a in ("--load-model", name)]
        if self.name.startswith("inferd-N"):
            n, _, mode = self.name[len("inferd-N"):].partition("-")
            extra = ["--frontend-direct", "false"] if mode == "core" else []
            return ([str(rb.INFERD), "--model-repository", str(repo), "--model-control-mode", "explicit", *loads,
                     "--http-port", h, "--grpc-port", g, "--metrics-port", m, "--frontend-processes", n, *extra],
                    {}, rb.ROOT)
        if self.name == "triton":
            if not rb.TRITON_SH.exists() or not (rb.TRITON_DIR / "venv" / "bin" / "python").exists():
                return "Triton reference not set up (triton_reference.sh setup)"
            return ([str(rb.TRITON_SH), "run", "--model-repository", str(repo), "--model-control-mode=explicit",
                     *[f"--load-model={name}" for name in MODELS], f"--http-port={h}", f"--grpc-port={g}",
                     f"--metrics-port={m}", "--log-verbose=0"], {}, self.workdir)
        return f"unknown server {self.name}"

    def cpu_split(self) -> dict[str, float]:
        """CPU seconds of the main process ("core"), the frontend processes and the rest (workers)."""
        main = self.ps()
        out = {"core": process_cpu_s(main), "frontends": 0.0, "workers": 0.0}
        for c in main.children(recursive=True):
            try:
                kind = "frontends" if "frontend_processes.frontend_main" in " ".join(c.cmdline()) else "workers"
                out[kind] += process_cpu_s(c)
            except rb.psutil.Error:
                pass
        return out


def http_bodies(work: Path) -> dict[str, Path]:
    add_sub = work / "add_sub.json"
    add_sub.write_text(json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "FP32", "shape": [16], "data": [1] * 16}]}, separators=(",", ":")))
    batched = work / "fixed_cost.json"
    batched.write_text(json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, separators=(",", ":")))
    return {"add_sub": add_sub, BATCHED: batched}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frontends", default="1,2", help="values of --frontend-processes to run (comma list)")
    ap.add_argument("--servers", default="inferd,triton",
                    help="comma list of inferd (one per --frontends value), inferd-N<n>, inferd-N<n>-core "
                         "(--frontend-direct false) and triton")
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port-base", type=int, default=19710)
    ap.add_argument("--no-record", action="store_true", help="do not write bench/results/*.json")
    ap.add_argument("--json", default="", help="also write the results (points, summary, scaling model) here")
    args = ap.parse_args()

    names: list[str] = []
    for want in args.servers.split(","):
        if want == "inferd":
            names += [f"inferd-N{int(n)}" for n in args.frontends.split(",")]
        elif want == "triton" or (want.startswith("inferd-N")
                                   and want[len("inferd-N"):].removesuffix("-core").isdigit()):
            names.append(want)
        else:
            ap.error(f"unknown server {want!r}: use inferd, inferd-N<n>, inferd-N<n>-core or triton")
    names = list(dict.fromkeys(names))
    stamp = datetime.now(timezone.utc)
    work = rb.BENCH / "out" / ("scaleout-" + stamp.strftime("%Y%m%d-%H%M%S"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    prepare_repo(repo)
    built = subprocess.run([str(rb.VENV_PY), str(rb.BENCH / "grpc_tool.py"), "build", "--out-dir", str(work / "req")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        print(built.stderr, file=sys.stderr)
        return 1
    grpc_bodies = json.loads(built.stdout)
    bodies = http_bodies(work)
    servers = [Server(n, (args.port_base + 10 * i, args.port_base + 10 * i + 1, args.port_base + 10 * i + 2), work)
               for i, n in enumerate(names)]
    res: dict = {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"), "commit": rb.git_commit(), "machine": rb.machine(),
                 "cpus_available": len(os.sched_getaffinity(0)), "command": " ".join(sys.argv),
                 "conc": args.conc, "duration_s": args.duration, "rounds": args.rounds, "points": [], "skipped": {}}
    try:
        for s in servers:
            print(f"== starting {s.name} on {s.ports}", flush=True)
            s.start(repo, 180)
            if s.skipped:
                print(f"   skipped: {s.skipped}", flush=True)
                res["skipped"][s.name] = s.skipped
                continue
            san = subprocess.run([str(rb.VENV_PY), str(rb.BENCH / "grpc_tool.py"), "sanity", "--url", s.grpc_url,
                                  "--out-dir", str(work / "req")], capture_output=True, text=True, timeout=300)
            s.info["grpc_sanity"] = json.loads(san.stdout) if san.returncode == 0 else {"error": san.stderr[-500:]}
        live = [s for s in servers if not s.skipped]
        for rnd in range(1, args.rounds + 1):
            for name, proto, model in SCENARIOS:
                order = live[rnd % len(live):] + live[:rnd % len(live)] if live else []
                for s in order:
                    cpu0: dict[str, float] | None = None
                    if proto == "http":
                        url = f"{s.base}/v2/models/{model}/infer"
                        if args.warmup > 0:
                            rb.run_wrk(url, args.conc, args.warmup, bodies[model], None)
                        cpu0 = s.cpu_split()
                        r = rb.run_wrk(url, args.conc, args.duration, bodies[model], None)
                    else:
                        san = s.info.get("grpc_sanity", {}).get(model, {})
                        if not san.get("ok"):
                            r = {"error": f"gRPC sanity failed: {s.info.get('grpc_sanity')}"}
                        else:
                            path, size = Path(grpc_bodies[model]["path"]), san["response_framed_bytes"]
                            if args.warmup > 0:
                                rb.run_h2load(f"http://{s.grpc_url}", args.conc, args.warmup, path, size, work)
                            cpu0 = s.cpu_split()
                            r = rb.run_h2load(f"http://{s.grpc_url}", args.conc, args.duration, path, size, work)
                    cpu1 = s.cpu_split()
                    point = {"round": rnd, "scenario": name, "server": s.name, **r}
                    if "error" not in r and r.get("requests") and cpu0 is not None:
                        split = {k: 1e6 * (cpu1[k] - cpu0[k]) / r["requests"] for k in cpu1}
                        point["server_cpu_ms"] = sum(split.values()) / 1e3
                        point["cpu_us_per_request"] = {k: round(v, 1) for k, v in split.items()}
                    res["points"].append(point)
                    show = (f"{r['infer_per_s']:.0f}/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms"
                            if "error" not in r else r["error"])
                    if "server_cpu_ms" in point:
                        split = point["cpu_us_per_request"]
                        show += (f" cpu µs/req: core {split['core']:.0f} frontends {split['frontends']:.0f}"
                                 f" workers {split['workers']:.0f}")
                    print(f"[r{rnd}] {name:24s} {s.name:10s} {show}"
                          f"{'  INVALID: ' + r['invalid'] if 'invalid' in r else ''}", flush=True)
    finally:
        for s in servers:
            s.stop()
    print()
    print("| scenario (c=%d) | " % args.conc + " | ".join(s.name for s in servers) + " |")
    print("|---" * (len(servers) + 1) + "|")
    summary: dict = {}
    for name, _, _ in SCENARIOS:
        cells = []
        for s in servers:
            vals = [p["infer_per_s"] for p in res["points"]
                    if p["scenario"] == name and p["server"] == s.name and "error" not in p and "invalid" not in p]
            if not vals:
                cells.append("—")
                continue
            med = statistics.median(vals)
            summary.setdefault(name, {})[s.name] = {"median_infer_per_s": med, "rounds": vals}
            cells.append(f"{med:.0f}/s [{', '.join(f'{v:.0f}' for v in vals)}]")
        print(f"| {name} | " + " | ".join(cells) + " |")
    res["summary"] = summary
    text, res["scaling_model"] = model_table(res["points"], [s.name for s in servers], args.conc)
    res["scaling_model_assumption"] = MODEL_HEADER
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if not args.no_record:
        out = rb.BENCH / "results" / f"scaleout-{stamp.strftime('%Y%m%d-%H%M')}-{res['commit']}.json"
        out.write_text(json.dumps(res, indent=1))
        print(f"\nrecorded {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
