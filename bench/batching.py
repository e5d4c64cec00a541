"""Dynamic batching benchmark (issue 4, "Measure"): what batching buys for a model whose execute()
costs a fixed 5 ms whatever the batch size, at concurrency 32, on inferd (as is, and with
--busy-poll-us as "inferd-busypoll"), Triton 2.51 and MLServer.

    .venv/bin/python bench/batching.py                       # all four servers, 3 rounds of 10 s points
    .venv/bin/python bench/batching.py --servers inferd -d 5 --rounds 1 --no-record

inferd and Triton serve the same config.pbtxt files (bench/models/fixed_cost: max_batch_size 32,
FP32 [4], one CPU instance): `fixed_cost` as is, and for each --delays-us value D a model
`fixed_cost_batched_<D>us` with `dynamic_batching { max_queue_delay_microseconds: D }` added.
MLServer gets the same model as a runtime, without and with adaptive batching (max_batch_size 32,
max_batch_time D, at least --mlserver-min-batch-time: MLServer needs a time window). The client is
wrk (closed loop, one request in flight per connection, --conc connections, KServe v2 JSON body).
Points are paired: every round measures each variant on every server back to back, rotating the
order, so load from other work on the machine (and the host's fast and slow spells) falls on all of
them alike; that load is recorded per point (foreign_cores). Ratios to Triton are also given per
round (ours / Triton from the same round) with their median.

Mean executed batch = inference_count / execution_count deltas from the statistics extension (inferd,
Triton); for MLServer the model counts its predict() calls and rows.
Results: bench/results/batching-<date>-<commit>.json and a section appended to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402  (bench/ is not a package)
    BENCH,
    INFERD,
    PEER_DIR,
    ROOT,
    TRITON_DIR,
    TRITON_SH,
    children_cpu,
    git_commit,
    http,
    loadavg,
    machine,
    run_wrk,
    system_busy,
    versions,
)

MODEL_SRC = BENCH / "models" / "fixed_cost"
UNBATCHED = "fixed_cost"


def batched_name(delay_us: int) -> str:
    return f"fixed_cost_batched_{delay_us}us"


def variant_label(variant: str) -> str:
    return "none" if variant == UNBATCHED else "delay " + variant.rsplit("_", 1)[1].replace("us", " µs")


TITLES = {"inferd": "inferd", "inferd-busypoll": "inferd --busy-poll-us", "triton": "Triton 2.51",
          "mlserver": "MLServer (adaptive batching)"}

MLSERVER_MODEL = '''import json
import os
import time

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class FixedCostModel(MLModel):
    """Echoes INPUT0 after a fixed cost per predict() call; counts calls and rows in COUNTS_FILE."""

    async def load(self) -> bool:
        self.cost_s = 0.005
        self.calls = self.rows = 0
        self.counts_file = os.path.join(os.getcwd(), self.name + ".counts.json")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        time.sleep(self.cost_s)  # the fixed cost: blocks like a compute-bound step would
        x = NumpyCodec.decode_input(payload.inputs[0])
        self.calls += 1
        self.rows += int(x.shape[0])
        with open(self.counts_file + ".tmp", "w") as f:
            json.dump({"calls": self.calls, "rows": self.rows}, f)
        os.replace(self.counts_file + ".tmp", self.counts_file)  # readers never see a partial file
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("OUTPUT0", x)])
'''


def free_ports(n: int) -> tuple[int, int, int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return tuple(sock.getsockname()[1] for sock in socks)  # type: ignore[return-value]
    finally:
        for sock in socks:
            sock.close()


def prepare_repo(repo: Path, delays_us: list[int]) -> None:
    if repo.exists():
        shutil.rmtree(repo)
    base = (MODEL_SRC / "config.pbtxt").read_text()
    variants: dict[str, str] = {UNBATCHED: ""}
    for d in delays_us:
        variants[batched_name(d)] = "dynamic_batching { max_queue_delay_microseconds: %d }\n" % d
    for name, extra in variants.items():
        shutil.copytree(MODEL_SRC, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        (repo / name / "config.pbtxt").write_text(base.replace('name: "fixed_cost"', f'name: "{name}"') + extra)


def prepare_mlserver(models: Path, ports: tuple[int, int, int], delays_us: list[int], min_time: float) -> None:
    if models.exists():
        shutil.rmtree(models)
    models.mkdir(parents=True)
    (models / "settings.json").write_text(json.dumps({
        "debug": False, "host": "127.0.0.1", "http_port": ports[0], "grpc_port": ports[1],
        "metrics_port": ports[2]}))
    batch_times: dict[str, float | None] = {UNBATCHED: None}
    batch_times.update({batched_name(d): max(d / 1e6, min_time) for d in delays_us})
    for name, batch_time in batch_times.items():
        (models / name).mkdir()
        (models / name / "model.py").write_text(MLSERVER_MODEL)
        settings = {"name": name, "implementation": "model.FixedCostModel", "platform": "mlserver",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
                    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]}
        if batch_time is not None:
            settings.update(max_batch_size=32, max_batch_time=batch_time)
        (models / name / "model-settings.json").write_text(json.dumps(settings, indent=1))


@dataclass
class Server:
    name: str
    ports: tuple[int, int, int]
    workdir: Path
    proc: subprocess.Popen | None = None
    skipped: str | None = None
    argv: list[str] = field(default_factory=list)
    busy_poll_us: int = 0  # inferd-busypoll's --busy-poll-us

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def start(self, repo: Path, variants: list[str], delays_us: list[int], min_time: float,
              timeout: float) -> None:
        h, g, m = (str(p) for p in self.ports)
        env, cwd = {}, self.workdir
        if self.name in ("inferd", "inferd-busypoll"):
            if not INFERD.exists():
                self.skipped = f"{INFERD} missing"
                return
            self.argv = [str(INFERD), "--model-repository", str(repo), "--http-port", h, "--grpc-port", g,
                         "--metrics-port", m]
            if self.name == "inferd-busypoll":
                self.argv += ["--busy-poll-us", str(self.busy_poll_us)]
            cwd = ROOT
        elif self.name == "triton":
            if not TRITON_SH.exists() or not (TRITON_DIR / "venv" / "bin" / "python").exists():
                self.skipped = "Triton reference not set up (bench/run.py --install-peers)"
                return
            self.argv = [str(TRITON_SH), "run", "--model-repository", str(repo), f"--http-port={h}",
                         f"--grpc-port={g}", f"--metrics-port={m}", "--log-verbose=0"]
        elif self.name == "mlserver":
            exe = PEER_DIR / "bin" / "mlserver"
            if not exe.exists():
                self.skipped = f"MLServer not installed in {PEER_DIR} (bench/run.py --install-peers)"
                return
            models = self.workdir / "mlserver-models"
            prepare_mlserver(models, self.ports, delays_us, min_time)
            cwd = self.workdir / "mlserver-cwd"
            cwd.mkdir(exist_ok=True)
            env = {"MLSERVER_PARALLEL_WORKERS": "0"}
            self.argv = [str(exe), "start", str(models)]
        else:
            self.skipped = "unknown server"
            return
        self.cwd = cwd
        with open(self.workdir / f"{self.name}.log", "wb") as log:
            self.proc = subprocess.Popen(self.argv, cwd=cwd, env={**os.environ, **env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.skipped = f"exited with {self.proc.returncode} during start (see {self.workdir})"
                self.proc = None
                return
            if all(http("GET", f"{self.base}/v2/models/{v}/ready", timeout=2)[0] == 200 for v in variants):
                return
            time.sleep(0.25)
        self.skipped = f"not ready within {timeout:.0f} s"
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session this harness started for it
            self.proc.wait(timeout=10)
        self.proc = None

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        main = psutil.Process(self.proc.pid)
        total = sum(main.cpu_times()[:2])
        for child in main.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    def batch_counts(self, model: str) -> tuple[int, int]:
        """(batch items, executions) so far."""
        if self.name == "mlserver":
            try:
                counts = json.loads((self.cwd / f"{model}.counts.json").read_text())
            except (OSError, ValueError):
                return 0, 0
            return counts["rows"], counts["calls"]
        code, body = http("GET", f"{self.base}/v2/models/{model}/stats", timeout=5)
        if code != 200:
            return 0, 0
        stats = json.loads(body)["model_stats"][0]
        return int(stats["inference_count"]), int(stats["execution_count"])


def measure(server: Server, model: str, conc: int, duration: float, warmup: float, body: Path) -> dict:
    url = f"{server.base}/v2/models/{model}/infer"
    if warmup > 0:
        run_wrk(url, conc, warmup, body, None)
    items0, execs0 = server.batch_counts(model)
    cpu0, client0, busy0, t0 = server.cpu_seconds(), children_cpu(), system_busy(), time.monotonic()
    point = run_wrk(url, conc, duration, body, None)
    cpu1, client1, busy1, t1 = server.cpu_seconds(), children_cpu(), system_busy(), time.monotonic()
    items1, execs1 = server.batch_counts(model)
    ours = (cpu1 - cpu0) + (client1 - client0)
    point["foreign_cores"] = round(max(0.0, (busy1 - busy0) - ours) / max(1e-9, t1 - t0), 2)
    point["server_cores"] = round((cpu1 - cpu0) / max(1e-9, t1 - t0), 2)
    if point.get("ok"):
        point["server_cpu_us"] = round((cpu1 - cpu0) / point["ok"] * 1e6, 1)  # every process of the server
    if execs1 > execs0:
        point["mean_batch"] = (items1 - items0) / (execs1 - execs0)
    return point


def summarize(points: list[dict], names: list[str], variants: list[str]) -> dict:
    out: dict = {}
    for name in names:
        row: dict = {}
        for variant in variants:
            pts = [p for p in points if p["server"] == name and p["model"] == variant and "error" not in p]
            if not pts:
                continue
            row[variant] = {k: statistics.median(p[k] for p in pts if k in p)
                            for k in ("infer_per_s", "p50_ms", "p99_ms", "mean_batch", "server_cpu_us", "foreign_cores")
                            if any(k in p for p in pts)}
            row[variant]["points"] = len(pts)
            row[variant]["invalid"] = sum(1 for p in pts if "invalid" in p)
        for variant, r in row.items():
            if variant != UNBATCHED and UNBATCHED in row:
                r["gain"] = r["infer_per_s"] / row[UNBATCHED]["infer_per_s"]
        out[name] = row
    return out


def paired_ratios(points: list[dict], ours: str, peer: str, variants: list[str]) -> dict:
    """Per variant, the median over rounds of ours / peer for points of the same round (measured back to
    back): throughput, p99 and gain (each side's batched / unbatched throughput of that round)."""
    by = {(p["round"], p["server"], p["model"]): p for p in points if "error" not in p and "invalid" not in p}
    rounds = sorted({r for r, _, _ in by})
    out: dict = {}
    for variant in variants:
        thr, p99, gain = [], [], []
        for r in rounds:
            a, b = by.get((r, ours, variant)), by.get((r, peer, variant))
            if not a or not b:
                continue
            thr.append(a["infer_per_s"] / b["infer_per_s"])
            p99.append(a["p99_ms"] / b["p99_ms"])
            a0, b0 = by.get((r, ours, UNBATCHED)), by.get((r, peer, UNBATCHED))
            if variant != UNBATCHED and a0 and b0:
                gain.append((a["infer_per_s"] / a0["infer_per_s"]) / (b["infer_per_s"] / b0["infer_per_s"]))
        if thr:
            out[variant] = {"throughput": thr, "p99": p99, "gain": gain}
    return out


def markdown(res: dict) -> str:
    s, variants, lines = res["summary"], res["variants"], []
    lines.append(f"## Dynamic batching: fixed 5 ms execute, c={res['conc']} ({res['date']}, commit {res['commit']})")
    lines.append("")
    lines.append(f"- Command: `{res['command']}`")
    m = res["machine"]
    lines.append(f"- Machine: {m.get('cpu', '?')}, {m.get('nproc', '?')} cores; load average at start "
                 f"{res['loadavg_start']}, at end {res['loadavg_end']}; CPU used by other work on the machine "
                 f"during the points (cores, median / max): {res['foreign_median']} / {res['foreign_max']}")
    lines.append("- Same config.pbtxt for inferd and Triton (bench/models/fixed_cost), plus "
                 "`dynamic_batching { max_queue_delay_microseconds: D }` for the batched rows; MLServer adaptive "
                 f"batching max_batch_size 32, max_batch_time D (at least {res['mlserver_min_batch_time']} s)")
    lines.append(f"- {res['rounds']} paired rounds of {res['duration_s']:.0f} s points (after {res['warmup_s']:.0f} s "
                 "warm-up); each variant is measured on every server back to back, server and variant order "
                 "rotated each round; medians over rounds. wrk, KServe v2 JSON "
                 "over HTTP, one request in flight per connection. Mean executed batch from the statistics "
                 "extension (MLServer: the model counts). Server CPU: user + system time of the server's "
                 "processes (supervisor, workers, Triton's stubs) per answered inference.")
    lines.append("")
    lines.append("| server | dynamic batching | infer/s | p50 ms | p99 ms | mean executed batch | server CPU µs "
                 "per inference | gain vs none |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, row in s.items():
        for variant in variants:
            r = row.get(variant)
            if not r:
                continue
            label = variant_label(variant)
            batch = f"{r['mean_batch']:.1f}" if "mean_batch" in r else "-"
            gain = f"**{r['gain']:.1f}x**" if "gain" in r else ""
            cpu = f"{r['server_cpu_us']:.0f}" if "server_cpu_us" in r else "-"
            flag = " (invalid points: %d)" % r["invalid"] if r["invalid"] else ""
            lines.append(f"| {TITLES.get(name, name)} | {label} | {r['infer_per_s']:.0f}{flag} | {r['p50_ms']:.1f} | "
                         f"{r['p99_ms']:.1f} | {batch} | {cpu} | {gain} |")
    for ours in ("inferd", "inferd-busypoll"):
        if ours not in s or "triton" not in s:
            continue
        lines.append("")
        for variant in variants:
            a, b = s[ours].get(variant), s["triton"].get(variant)
            if a and b:
                lines.append(f"- {TITLES[ours]} / Triton, {variant}: throughput "
                             f"{a['infer_per_s'] / b['infer_per_s']:.2f}x, p99 {a['p99_ms'] / b['p99_ms']:.2f}x"
                             + (f", gain {a['gain']:.1f}x vs {b['gain']:.1f}x" if "gain" in a and "gain" in b else ""))
    pairs = res.get("paired", {})
    if pairs:
        lines.append("")
        lines.append("Paired per round (each ratio from points of one round, measured back to back; median over "
                     "rounds, then the per-round values):")
        lines.append("")
        lines.append("| ours / Triton | dynamic batching | throughput | p99 | gain |")
        lines.append("|---|---|---|---|---|")

        def cell(values: list[float]) -> str:
            if not values:
                return "-"
            return f"**{statistics.median(values):.2f}x** ({', '.join(f'{v:.2f}' for v in values)})"

        for ours, per_variant in pairs.items():
            for variant in variants:
                r = per_variant.get(variant)
                if r:
                    lines.append(f"| {TITLES.get(ours, ours)} | {variant_label(variant)} | {cell(r['throughput'])} "
                                 f"| {cell(r['p99'])} | {cell(r['gain'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="inferd,inferd-busypoll,triton,mlserver")
    ap.add_argument("--busy-poll-us", type=int, default=12000, help="inferd-busypoll's window")
    ap.add_argument("--conc", type=int, default=32)
    ap.add_argument("-d", "--duration", type=float, default=10.0, help="seconds per measured point")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--delays-us", default="0,10000", help="max_queue_delay_microseconds of the batched variants")
    ap.add_argument("--mlserver-min-batch-time", type=float, default=0.001, help="seconds")
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--no-record", action="store_true",
                    help="don't append to bench/RESULTS.md; JSON goes to bench/out instead of bench/results")
    args = ap.parse_args()

    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    delays = [int(d) for d in args.delays_us.split(",") if d.strip()]
    variants = [batched_name(d) for d in delays] + [UNBATCHED]
    stamp = datetime.now(timezone.utc)
    commit = git_commit()
    work = BENCH / "out" / ("batching-" + stamp.strftime("%Y%m%d-%H%M%S"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    prepare_repo(repo, delays)
    body = work / "request.json"
    body.write_text(json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                            "data": [1, 2, 3, 4]}]}))
    servers = [Server(n, free_ports(3), work, busy_poll_us=args.busy_poll_us) for n in names]
    res: dict = {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit, "machine": machine(),
                 "command": shlex.join([".venv/bin/python", "bench/batching.py", *sys.argv[1:]]),
                 "tools": versions(), "conc": args.conc, "duration_s": args.duration, "warmup_s": args.warmup,
                 "rounds": args.rounds, "variants": variants, "mlserver_min_batch_time": args.mlserver_min_batch_time,
                 "loadavg_start": loadavg(), "skipped": {}, "points": []}
    try:
        for s in servers:
            print(f"== starting {s.name}", flush=True)
            s.start(repo, variants, delays, args.mlserver_min_batch_time, args.start_timeout)
            if s.skipped:
                print(f"   skipped: {s.skipped}", flush=True)
                res["skipped"][s.name] = s.skipped
        live = [s for s in servers if not s.skipped]
        for rnd in range(args.rounds):
            # one variant at a time, every server back to back: the host's fast and slow spells (minutes
            # long on a shared VM) then fall on all servers of a comparison alike
            j = rnd % len(variants)
            for model in variants[j:] + variants[:j]:
                k = rnd % max(1, len(live))
                for s in live[k:] + live[:k]:
                    point = {"round": rnd + 1, "server": s.name, "model": model, "loadavg": loadavg(),
                             **measure(s, model, args.conc, args.duration, args.warmup, body)}
                    res["points"].append(point)
                    show = (f"{point['infer_per_s']:.0f}/s p50 {point['p50_ms']:.1f} p99 {point['p99_ms']:.1f} ms "
                            f"batch {point.get('mean_batch', 0):.1f}" if "error" not in point else point["error"])
                    print(f"[r{rnd + 1}] {s.name:9s} {model:28s} {show}  (other load {point['foreign_cores']} "
                          f"cores){'  INVALID: ' + point['invalid'] if 'invalid' in point else ''}", flush=True)
    finally:
        for s in servers:
            s.stop()
    res["loadavg_end"] = loadavg()
    foreign = [p["foreign_cores"] for p in res["points"] if "foreign_cores" in p]
    res["foreign_median"] = statistics.median(foreign) if foreign else None
    res["foreign_max"] = max(foreign) if foreign else None
    res["summary"] = summarize(res["points"], names, variants)
    if "triton" in names:
        res["paired"] = {ours: paired_ratios(res["points"], ours, "triton", variants)
                         for ours in ("inferd", "inferd-busypoll") if ours in names}
    md = markdown(res)
    print("\n" + md)
    name = f"batching-{stamp.strftime('%Y%m%d-%H%M%S')}-{commit}.json"
    out = work / name if args.no_record else BENCH / "results" / name  # trial runs stay in bench/out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"JSON: {out.relative_to(ROOT)}")
    if not args.no_record:
        with open(BENCH / "RESULTS.md", "a") as f:
            f.write("\n" + md + f"\nRaw: `{out.relative_to(ROOT)}`\n")
        print("appended to bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
