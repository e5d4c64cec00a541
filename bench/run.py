"""Side-by-side benchmark: inferd vs NVIDIA Triton 2.51 vs MLServer on the same models.

    .venv/bin/python bench/run.py                      # everything, 10 s per point, 2 rounds
    .venv/bin/python bench/run.py --servers inferd,triton --scenarios http_add_sub_c16 -d 5
    .venv/bin/python bench/run.py --install-peers      # install MLServer + Triton reference, then run

One model repository (bench/out/<run>/repo: add_sub, identity_4mib, trivial) is served by inferd and
Triton; MLServer gets equivalent runtimes in its scratch dir. All servers run at once, each on its own
ports; every scenario is measured server after server, A B C C B A (--rounds), with one client: wrk
(HTTP, Lua script, status codes checked) and h2load (gRPC: pre-serialized ModelInferRequest, gRPC
framing; h2load only sees HTTP status, so every point is checked against the exact response size
recorded by a raw gRPC call in grpc_tool.py, plus a tritonclient call per server).

Results: bench/results/<date>-<commit>.json and a section appended to bench/RESULTS.md.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
VENV_PY = ROOT / ".venv" / "bin" / "python"
INFERD = ROOT / ".venv" / "bin" / "inferd"
PYSPY = ROOT / ".venv" / "bin" / "py-spy"
TRITON_SH = Path("/work/shared/tools/triton_reference.sh")
TRITON_DIR = Path(os.environ.get("TRITON_REF_DIR", Path.home() / ".cache" / "triton-reference"))
PEER_DIR = Path(os.environ.get("INFERD_BENCH_MLSERVER", Path.home() / ".cache" / "inferd-bench" / "mlserver"))
IDENTITY_ELEMS = 1 << 20
IDENTITY_BYTES = IDENTITY_ELEMS * 4

# ----------------------------------------------------------------------------------------------
# scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    proto: str  # http | grpc
    model: str
    conc: int
    label: str
    busy: bool = False  # a neighbour process spins on one CPU for the whole point (Neighbour below)


SCENARIOS = [
    Scenario("http_add_sub_c1", "http", "add_sub", 1, "add_sub HTTP c=1"),
    Scenario("http_add_sub_c16", "http", "add_sub", 16, "add_sub HTTP c=16"),
    Scenario("grpc_add_sub_c1", "grpc", "add_sub", 1, "add_sub gRPC c=1"),
    Scenario("grpc_add_sub_c16", "grpc", "add_sub", 16, "add_sub gRPC c=16"),
    Scenario("http_add_sub_c16_busy", "http", "add_sub", 16, "add_sub HTTP c=16, one CPU busy", busy=True),
    Scenario("grpc_add_sub_c16_busy", "grpc", "add_sub", 16, "add_sub gRPC c=16, one CPU busy", busy=True),
    Scenario("grpc_identity_4mib_c1", "grpc", "identity_4mib", 1, "identity 4 MiB gRPC c=1"),
    Scenario("grpc_identity_4mib_c4", "grpc", "identity_4mib", 4, "identity 4 MiB gRPC c=4"),
]
EXTRA = ["coldstart", "rss"]

# ----------------------------------------------------------------------------------------------
# model repositories

IDENTITY_CONFIG = f"""name: "identity_4mib"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {IDENTITY_ELEMS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {IDENTITY_ELEMS} ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

TRIVIAL_CONFIG = """name: "trivial"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

MLSERVER_MODEL_PY = '''import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class AddSubModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {inp.name: inp for inp in payload.inputs}
        a = NumpyCodec.decode_input(by_name["INPUT0"]).astype(np.float32)
        b = NumpyCodec.decode_input(by_name["INPUT1"]).astype(np.float32)
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id,
            outputs=[NumpyCodec.encode_output("OUTPUT0", a + b),
                     NumpyCodec.encode_output("OUTPUT1", a - b)])


class IdentityModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id,
            outputs=[NumpyCodec.encode_output("OUTPUT0", x)])
'''


def prepare_repo(repo: Path) -> None:
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    shutil.copytree(ROOT / "examples" / "add_sub", repo / "add_sub")
    ident_src = ROOT / "examples" / "identity_fp32" / "1" / "model.py"
    for name, cfg in (("identity_4mib", IDENTITY_CONFIG), ("trivial", TRIVIAL_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(cfg)
        shutil.copy(ident_src, repo / name / "1" / "model.py")
    for p in repo.rglob("__pycache__"):
        shutil.rmtree(p)


def prepare_mlserver_repo(models: Path, ports: tuple[int, int, int]) -> None:
    if models.exists():
        shutil.rmtree(models)
    models.mkdir(parents=True)
    (models / "settings.json").write_text(json.dumps({
        "debug": False, "host": "127.0.0.1", "http_port": ports[0], "grpc_port": ports[1],
        "metrics_port": ports[2]}, indent=1))
    specs = {
        "add_sub": ("AddSubModel", [("INPUT0", 16), ("INPUT1", 16)], [("OUTPUT0", 16), ("OUTPUT1", 16)]),
        "identity_4mib": ("IdentityModel", [("INPUT0", IDENTITY_ELEMS)], [("OUTPUT0", IDENTITY_ELEMS)]),
    }
    for name, (cls, ins, outs) in specs.items():
        d = models / name
        d.mkdir()
        (d / "model.py").write_text(MLSERVER_MODEL_PY)
        (d / "model-settings.json").write_text(json.dumps({
            "name": name, "implementation": f"model.{cls}", "platform": "mlserver",
            "inputs": [{"name": n, "datatype": "FP32", "shape": [k]} for n, k in ins],
            "outputs": [{"name": n, "datatype": "FP32", "shape": [k]} for n, k in outs]}, indent=1))


# ----------------------------------------------------------------------------------------------
# servers


def http(method: str, url: str, body: bytes | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e).encode()


@dataclass
class Server:
    name: str
    ports: tuple[int, int, int]
    workdir: Path
    proc: subprocess.Popen | None = None
    skipped: str | None = None
    startup_s: float | None = None
    info: dict = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def command(self, repo: Path) -> tuple[list[str], dict, Path] | str:
        """(argv, extra env, cwd), or the reason the server can't run here."""
        h, g, m = (str(p) for p in self.ports)
        if self.name in ("inferd", "inferd-nopoll"):
            if not INFERD.exists():
                return f"{INFERD} missing (make venv)"
            # inferd-nopoll: the same server with busy polling off (its default is on with 2+ CPUs)
            nopoll = ["--busy-poll-us", "0"] if self.name == "inferd-nopoll" else []
            return ([str(INFERD), "--model-repository", str(repo), "--model-control-mode", "explicit",
                     "--load-model", "add_sub", "--load-model", "identity_4mib",
                     "--http-port", h, "--grpc-port", g, "--metrics-port", m, *nopoll], {}, ROOT)
        if self.name == "triton":
            if not TRITON_SH.exists() or not (TRITON_DIR / "venv" / "bin" / "python").exists():
                return "Triton reference not set up (run with --install-peers, or triton_reference.sh setup)"
            return ([str(TRITON_SH), "run", "--model-repository", str(repo),
                     "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=identity_4mib",
                     f"--http-port={h}", f"--grpc-port={g}", f"--metrics-port={m}", "--log-verbose=0"],
                    {}, self.workdir)
        if self.name == "mlserver":
            exe = PEER_DIR / "bin" / "mlserver"
            if not exe.exists():
                return f"MLServer not installed in {PEER_DIR} (run with --install-peers)"
            models = self.workdir / "mlserver-models"
            prepare_mlserver_repo(models, self.ports)
            cwd = self.workdir / "mlserver-cwd"
            cwd.mkdir(exist_ok=True)
            env = {"MLSERVER_PARALLEL_WORKERS": "0", "MLSERVER_GRPC_MAX_MESSAGE_LENGTH": str(256 << 20)}
            return [str(exe), "start", str(models)], env, cwd
        return f"unknown server {self.name}"

    def start(self, repo: Path, timeout: float) -> None:
        cmd = self.command(repo)
        if isinstance(cmd, str):
            self.skipped = cmd
            return
        argv, env, cwd = cmd
        self.info["argv"] = argv
        t0 = time.monotonic()
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=logf,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                self.skipped = f"exited with {self.proc.returncode} during start (see {self.log})"
                self.proc = None
                return
            if all(http("GET", f"{self.base}/v2/models/{m}/ready", timeout=2)[0] == 200
                   for m in ("add_sub", "identity_4mib")):
                self.startup_s = time.monotonic() - t0
                return
            time.sleep(0.25)
        self.skipped = f"not ready within {timeout:.0f} s (see {self.log})"
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this harness created for it
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.proc = None

    def ps(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def cpu_seconds(self) -> tuple[float, float]:
        """(main process, all descendants) user+sys CPU seconds, for CPU-per-request accounting."""
        main = self.ps()
        t = main.cpu_times()
        kids = 0.0
        for c in main.children(recursive=True):
            try:
                ct = c.cpu_times()
                kids += ct.user + ct.system
            except psutil.Error:
                pass
        return t.user + t.system, kids


# ----------------------------------------------------------------------------------------------
# the busy host: a neighbour process


NEIGHBOUR_PY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


class Neighbour:
    """Another process spinning on one CPU (pinned with sched_setaffinity) for the whole point, warm-up
    included: the common production case of a model or another service burning CPU beside the server.
    Its CPU time is kept apart from the servers', the clients' and other people's."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR_PY, str(cpu)], stdin=subprocess.DEVNULL)
        self._ps = psutil.Process(self.proc.pid)

    def cpu_seconds(self) -> float:
        try:
            t = self._ps.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


# ----------------------------------------------------------------------------------------------
# load generators


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def system_busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, round(q / 100 * (len(sorted_vals) - 1))))
    return sorted_vals[i]


def run_wrk(url: str, conc: int, duration: float, body: Path, header_len: int | None) -> dict:
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_HEADER_LEN": str(header_len or "")}
    argv = ["wrk", "-t1", f"-c{conc}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
            "-s", str(BENCH / "wrk_infer.lua"), url]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=duration + 60)
    line = next((s for s in reversed(p.stdout.splitlines()) if s.startswith("{")), None)
    if p.returncode != 0 or line is None:
        return {"error": f"wrk rc={p.returncode}: {p.stderr.strip()[-300:]}"}
    w = json.loads(line)
    dur = w["duration_us"] / 1e6
    ok = w["requests"] - w["status_errors"]
    sock_err = w["connect_errors"] + w["read_errors"] + w["write_errors"] + w["timeouts"]
    r = {"tool": "wrk", "requests": w["requests"], "ok": ok, "non_2xx": w["status_errors"],
         "socket_errors": sock_err, "duration_s": dur, "infer_per_s": ok / dur,
         "p50_ms": w["p50_us"] / 1e3, "p90_ms": w["p90_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
         "max_ms": w["max_us"] / 1e3, "mean_ms": w["mean_us"] / 1e3}
    if w["status_errors"] or sock_err:
        r["invalid"] = f"{w['status_errors']} non-2xx responses, {sock_err} socket errors"
    return r


H2_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
H2_REQ = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                    r"(\d+) errored, (\d+) timeout")
H2_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
H2_TRAFFIC = re.compile(r"traffic: .*? \((\d+)\) total, .*? \((\d+)\) headers .*?, .*? \((\d+)\) data")


def h2load_argv(url: str, conc: int, duration: float, body: Path) -> list[str]:
    return ["h2load", "-t1", f"-c{conc}", "-m1", "-D", str(max(1, round(duration))),
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
            f"{url}/inference.GRPCInferenceService/ModelInfer"]


def warm_h2load(url: str, conc: int, warmup: float, body: Path) -> None:
    """A separate run: h2load's --warm-up-time traffic would pollute the byte check."""
    subprocess.run(h2load_argv(url, conc, warmup, body), capture_output=True, timeout=warmup + 60)


def run_h2load(url: str, conc: int, duration: float, body: Path, expect_resp: int, logdir: Path) -> dict:
    log = logdir / "h2load-requests.tsv"
    argv = h2load_argv(url, conc, duration, body)
    argv.insert(-1, f"--log-file={log}")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
    out = p.stdout
    mf, mr, ms, mt = (rx.search(out) for rx in (H2_FINISHED, H2_REQ, H2_STATUS, H2_TRAFFIC))
    if p.returncode != 0 or not (mf and mr and ms and mt):
        return {"error": f"h2load rc={p.returncode}: {(p.stderr or out).strip()[-400:]}"}
    dur = float(mf.group(1)) / (1000 if mf.group(2) == "ms" else 1)
    done, succeeded, failed, errored, timeouts = (int(mr.group(i)) for i in (3, 4, 5, 6, 7))
    non2xx = sum(int(ms.group(i)) for i in (2, 3, 4))
    data = int(mt.group(3))
    lat: list[float] = []
    if log.exists():
        for row in log.read_text().splitlines():
            parts = row.split("\t")
            if len(parts) >= 3 and parts[1] == "200":
                lat.append(int(parts[2]) / 1e3)
        log.unlink()
    lat.sort()
    # h2load counts an HTTP 200 carrying grpc-status != 0 as a success. An error answer carries no
    # DATA (trailers only), a good one exactly `expect_resp` bytes; stopped in-flight responses can
    # only add bytes. So missing bytes = failed RPCs.
    short = done * expect_resp - data
    grpc_err_est = max(0, -(-short // expect_resp)) if short > 0 else 0
    ok = succeeded - grpc_err_est
    r = {"tool": "h2load", "requests": done, "ok": ok, "non_2xx": non2xx + failed + errored + timeouts,
         "grpc_errors_est": grpc_err_est, "data_bytes": data, "expected_resp_bytes": expect_resp,
         "mean_resp_bytes": data / done if done else 0, "duration_s": dur, "infer_per_s": ok / dur,
         "p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "p99_ms": percentile(lat, 99),
         "max_ms": lat[-1] if lat else float("nan"),
         "mean_ms": statistics.fmean(lat) if lat else float("nan"), "latency_samples": len(lat)}
    problems = []
    if r["non_2xx"]:
        problems.append(f"{r['non_2xx']} failed/non-2xx")
    if grpc_err_est:
        problems.append(f"~{grpc_err_est} responses without the expected bytes (grpc errors)")
    if problems:
        r["invalid"] = ", ".join(problems)
    return r


# ----------------------------------------------------------------------------------------------
# cold start and RSS


def worker_rss(server: Server) -> list[dict]:
    out = []
    for c in server.ps().children(recursive=True):
        try:
            mi = c.memory_full_info()
            out.append({"pid": c.pid, "cmd": " ".join(c.cmdline())[:120], "rss_mb": mi.rss / 1e6,
                        "uss_mb": mi.uss / 1e6, "pss_mb": getattr(mi, "pss", 0) / 1e6})
        except psutil.Error:
            pass
    return out


def measure_coldstart(server: Server, cycles: int) -> dict:
    """Load `trivial` through the repository API (explicit mode): request -> ready, then idle RSS."""
    load = f"{server.base}/v2/repository/models/trivial/load"
    unload = f"{server.base}/v2/repository/models/trivial/unload"
    ready = f"{server.base}/v2/models/trivial/ready"
    times, rss_after = [], []
    for _ in range(cycles):
        before = {c.pid for c in server.ps().children(recursive=True)}
        t0 = time.monotonic()
        code, body = http("POST", load, b"{}", timeout=120)
        dt = time.monotonic() - t0
        if code != 200:
            return {"error": f"load -> {code}: {body[:200]!r}"}
        if http("GET", ready)[0] != 200:
            return {"error": "load returned 200 but the model is not ready"}
        times.append(dt)
        time.sleep(1.0)  # idle
        new = [w for w in worker_rss(server) if w["pid"] not in before]
        rss_after.extend(new)
        http("POST", unload, b"{}", timeout=60)
        t1 = time.monotonic()
        while http("GET", ready)[0] == 200 and time.monotonic() - t1 < 30:
            time.sleep(0.05)
        # let the old worker go away before the next spawn
        t1 = time.monotonic()
        while time.monotonic() - t1 < 10 and any(
                c.pid not in before for c in server.ps().children(recursive=True)):
            time.sleep(0.05)
    r: dict = {"cycles": cycles, "load_s": times, "load_median_s": statistics.median(times),
               "load_min_s": min(times), "load_max_s": max(times), "new_process_rss": rss_after}
    if rss_after:
        r["new_process_rss_mb_median"] = statistics.median(w["rss_mb"] for w in rss_after)
        r["new_process_uss_mb_median"] = statistics.median(w["uss_mb"] for w in rss_after)
    if server.name == "inferd":  # the server's own account of the load
        logged = re.findall(r"successfully loaded 'trivial' version\(s\) \S+ in ([\d.]+)s",
                            server.log.read_text(errors="replace"))
        r["log_load_s"] = [float(x) for x in logged]
    return r


def measure_rss(server: Server) -> dict:
    main = server.ps().memory_full_info()
    kids = worker_rss(server)
    r = {"main_rss_mb": main.rss / 1e6, "main_uss_mb": main.uss / 1e6, "children": kids}
    if kids:
        r["child_rss_mb_max"] = max(k["rss_mb"] for k in kids)
        r["child_uss_mb_max"] = max(k["uss_mb"] for k in kids)
    return r


# ----------------------------------------------------------------------------------------------
# profiling (inferd only, outside the measured rounds)


IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll ", "ppoll", "select ", "nanosleep", "clock_nanosleep",
               "pthread_cond_wait", "pthread_cond_timedwait")
IDLE_PY = ("_watch (inferd/worker/lifeline.py)",)  # the worker's lifeline thread blocks in read()


def summarize_raw_profile(path: Path, top: int = 15) -> dict:
    """py-spy --native --format raw ('frame;...;leaf count'): ignore samples parked in epoll & co, then
    attribute each busy sample to its leaf (native or Python) and to its innermost Python frame."""
    leaf_t: dict[str, int] = {}
    pyself: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = busy = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        total += k
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))] or ["?"]
        if frames[-1].startswith(IDLE_LEAVES) or any(f.startswith(IDLE_PY) for f in frames):
            continue
        busy += k
        leaf_t[frames[-1]] = leaf_t.get(frames[-1], 0) + k
        py = [f for f in frames if ".py)" in f]
        key = py[-1] if py else frames[-1]
        pyself[key] = pyself.get(key, 0) + k
        for f in {f for f in frames if ".py)" in f}:
            incl[f] = incl.get(f, 0) + k

    def rows(d: dict[str, int]) -> list[dict]:
        return [{"frame": f, "samples": c, "pct": round(100 * c / max(1, busy), 1)}
                for f, c in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "busy_samples": busy, "leaf": rows(leaf_t), "python_self": rows(pyself),
            "inclusive": rows(incl)}


def profile_inferd(server: Server, duration: float, outdir: Path, http_body: Path,
                   header_len: int | None, rate: int = 200) -> dict:
    if not PYSPY.exists():
        return {"skipped": f"{PYSPY} missing (.venv/bin/pip install py-spy)"}
    url = f"{server.base}/v2/models/add_sub/infer"
    result = {}
    kids = server.ps().children()
    targets = {"supervisor": server.proc.pid}
    # the add_sub worker is the busiest child while add_sub is being served
    busy = {}
    for c in kids:
        try:
            busy[c.pid] = c.cpu_times().user
        except psutil.Error:
            pass
    run_wrk(url, 16, 2, http_body, header_len)
    for c in kids:
        try:
            busy[c.pid] = c.cpu_times().user - busy.get(c.pid, 0)
        except psutil.Error:
            pass
    if busy:
        targets["add_sub_worker"] = max(busy, key=busy.get)
    for label, pid in targets.items():
        raw = outdir / f"profile-{label}.txt"
        d = max(3, round(duration))
        spy = [str(PYSPY), "record", "-p", str(pid), "-r", str(rate), "-d", str(d), "--native"]
        p_raw = subprocess.Popen(spy + ["--format", "raw", "-o", str(raw)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        load = run_wrk(url, 16, d, http_body, header_len)
        _, err = p_raw.communicate(timeout=d + 60)
        if not raw.exists():
            result[label] = {"error": err.strip()[-300:]}
            continue
        summary = summarize_raw_profile(raw)
        summary["expected_samples_if_always_busy"] = rate * d
        summary["load_during_profile"] = {k: load.get(k) for k in ("infer_per_s", "p50_ms", "p99_ms")}
        result[label] = summary
    return result


# ----------------------------------------------------------------------------------------------
# peers


def install_peers() -> None:
    if TRITON_SH.exists() and not (TRITON_DIR / "venv" / "bin" / "python").exists():
        print("== triton_reference.sh setup", flush=True)
        subprocess.run([str(TRITON_SH), "setup"], check=False)
    if not (PEER_DIR / "bin" / "mlserver").exists():
        print(f"== installing MLServer into {PEER_DIR} (peers.md §9.1)", flush=True)
        py = shutil.which("python3.11") or "python3.11"
        steps = [[py, "-m", "venv", str(PEER_DIR)],
                 [str(PEER_DIR / "bin" / "pip"), "install", "-q", "-U", "pip"],
                 [str(PEER_DIR / "bin" / "pip"), "install", "-q", "mlserver", "tritonclient[all]"],
                 [str(PEER_DIR / "bin" / "pip"), "install", "-q", "uvloop<0.22"]]
        for s in steps:
            if subprocess.run(s).returncode != 0:
                print(f"   MLServer install failed at: {shlex.join(s)}", flush=True)
                return
        with open(PEER_DIR / "requirements.lock.txt", "w") as f:
            subprocess.run([str(PEER_DIR / "bin" / "pip"), "freeze"], stdout=f)


# ----------------------------------------------------------------------------------------------
# reporting


def machine() -> dict:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version()}


def git_commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "supervisor", "worker"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return p.stdout.strip() + ("+dirty" if dirty else "")


def versions() -> dict:
    v = {}
    for name, exe in (("wrk", ["wrk", "-v"]), ("h2load", ["h2load", "--version"])):
        try:
            p = subprocess.run(exe, capture_output=True, text=True, timeout=5)
            v[name] = (p.stdout + p.stderr).strip().splitlines()[0][:80]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            v[name] = "missing"
    return v


def agg(points: list[dict]) -> dict | None:
    good = [p for p in points if "error" not in p]
    if not good:
        return None
    keys = ("infer_per_s", "p50_ms", "p99_ms", "mb_per_s", "server_main_cpu_ms", "server_children_cpu_ms",
            "client_cpu_ms")
    a = {k: statistics.fmean(p[k] for p in good) for k in keys if all(k in p for p in good)}
    if "server_main_cpu_ms" in a:
        a["server_cpu_ms"] = a["server_main_cpu_ms"] + a["server_children_cpu_ms"]
    a["rounds"] = [round(p["infer_per_s"], 1) for p in good]
    a["invalid"] = [p["invalid"] for p in good if "invalid" in p]
    return a


@dataclass(frozen=True)
class Target:
    metric: str  # a key of agg()
    ratio: float  # inferd's figure against Triton's in the same run
    higher_is_better: bool
    desc: str
    p99_no_worse: bool = False

    def met(self, i: dict, t: dict) -> bool | None:
        if self.metric not in i or self.metric not in t:
            return None
        ok = (i[self.metric] >= self.ratio * t[self.metric] if self.higher_is_better
              else i[self.metric] <= self.ratio * t[self.metric])
        return ok and (not self.p99_no_worse or i["p99_ms"] <= t["p99_ms"])


TARGETS = {  # scenario -> target against Triton in the same run (issue 25 for c=1, busy, CPU)
    "http_add_sub_c1": Target("p50_ms", 1.0, False, "p50 ≤ Triton's (issue 25)"),
    "grpc_add_sub_c1": Target("p50_ms", 1.0, False, "p50 ≤ Triton's (issue 25)"),
    "http_add_sub_c16": Target("infer_per_s", 1.0, True, "≥ 1.0× Triton infer/s, p99 no worse", True),
    "grpc_add_sub_c16": Target("infer_per_s", 0.8, True, "≥ 0.8× Triton infer/s"),
    "http_add_sub_c16_busy": Target("infer_per_s", 1.2, True, "≥ 1.2× Triton infer/s (issue 25)"),
    "grpc_identity_4mib_c1": Target("mb_per_s", 1.0, True, "≥ 1.0× Triton MB/s"),
    "grpc_identity_4mib_c4": Target("mb_per_s", 1.0, True, "≥ 1.0× Triton MB/s"),
}
CPU_TARGETS = {  # server CPU per inference, all processes (issue 25)
    name: Target("server_cpu_ms", 0.7, False, "≤ 0.7× Triton's (issue 25)")
    for name in ("http_add_sub_c16", "grpc_add_sub_c16")
}


def verdict(target: Target | None, i: dict | None, t: dict | None) -> str:
    if target is None:
        return ""
    met = target.met(i, t) if i and t else None
    text = ("" if met is None else "✅ " if met else "❌ ") + target.desc
    if met is not None and target.metric == "p50_ms" and t and t["p50_ms"]:
        text += f": {i['p50_ms'] / t['p50_ms']:.2f}×"  # type: ignore[index]
    return text


def cell(a: dict | None, big: bool) -> str:
    if a is None:
        return "—"
    lead = f"{a['mb_per_s']:.0f} MB/s" if big else f"{a['infer_per_s']:.0f}/s"
    spread = "/".join(f"{x:.0f}" if not big else f"{x:.1f}" for x in a["rounds"])
    s = f"{lead} · {a['p50_ms']:.2f} / {a['p99_ms']:.2f} ms ({spread})"
    if a["invalid"]:
        s += " ⚠ " + "; ".join(a["invalid"])
    return s


def markdown(res: dict) -> str:
    srv = [s for s in res["servers"] if s not in res["skipped"]]
    title = {"inferd": "inferd", "inferd-nopoll": "inferd, no polling", "triton": "Triton 2.51",
             "mlserver": "MLServer 1.7.1 (workers=0)"}
    m = res["machine"]
    fc = [p["foreign_cores"] for p in res["points"] if "foreign_cores" in p]
    foreign = (f"mean {statistics.fmean(fc):.2f}, max {max(fc):.2f} of {m['nproc']} cores" if fc else "n/a")
    lines = [f"## {res['date']} — commit `{res['commit']}`", "",
             f"- Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gb']} GiB RAM, Linux {m['kernel']}",
             f"- Command: `{res['command']}`",
             f"- {res['duration_s']:.0f} s per point ({res['warmup_s']:.0f} s warm-up), {res['rounds']} rounds "
             f"alternating {' → '.join(srv)} (reversed in even rounds); HTTP body: {res['http_body']}; "
             f"clients: {res['tools']['wrk']}, "
             f"{res['tools']['h2load']} (1 thread each, one request in flight per connection)",
             f"- Load average: {res['loadavg_start']} at start, {res['loadavg_end']} at end "
             "(shared CPU: other engineers' test runs); CPU used by other processes during the points: "
             f"{foreign}"]
    for s, why in res["skipped"].items():
        lines.append(f"- **{s} skipped**: {why}")
    lines += ["", "Cells: infer/s (or MB/s) · p50 / p99 latency, mean over rounds (per-round infer/s or MB/s). "
              "MB/s counts the 4 MiB request tensor once per inference (one direction, 10⁶ B).", ""]
    hdr = "| Scenario | " + " | ".join(title[s] for s in srv) + " | inferd / Triton | Target |"
    lines += [hdr, "|" + "---|" * (len(srv) + 3)]
    for sc in res["scenario_list"]:
        row = res["summary"].get(sc.name, {})
        big = sc.model == "identity_4mib"
        cells = [cell(row.get(s), big) for s in srv]
        ratio = ""
        i, t = row.get("inferd"), row.get("triton")
        metric = "mb_per_s" if big else "infer_per_s"
        if i and t and t.get(metric):
            ratio = f"{i[metric] / t[metric]:.2f}×"
        verdict_cell = verdict(TARGETS.get(sc.name), i, t)
        lines.append(f"| {sc.label} | " + " | ".join(cells) + f" | {ratio} | {verdict_cell} |")
    busy = [p for p in res["points"] if "neighbour_cores" in p]
    if busy:
        nc = [p["neighbour_cores"] for p in busy]
        lines += ["", f"\"one CPU busy\": a neighbour process spinning in a Python loop pinned to CPU "
                  f"{busy[0]['neighbour_cpu']} for each whole point, warm-up included (it used {min(nc):.2f}–"
                  f"{max(nc):.2f} cores while measured)."]

    lines += ["", "Server CPU per inference (ms, main process + child processes = total; client CPU for "
              "reference; the ratio and target compare the totals):", "",
              "| Scenario | " + " | ".join(title[s] for s in srv) + " | inferd / Triton | Target |",
              "|" + "---|" * (len(srv) + 3)]
    for sc in res["scenario_list"]:
        row = res["summary"].get(sc.name, {})
        cs = []
        for s in srv:
            a = row.get(s)
            cs.append("—" if not a or "server_cpu_ms" not in a else
                      f"{a['server_main_cpu_ms']:.3f} + {a['server_children_cpu_ms']:.3f} = "
                      f"**{a['server_cpu_ms']:.3f}** (client {a['client_cpu_ms']:.3f})")
        i, t = row.get("inferd"), row.get("triton")
        ratio = (f"{i['server_cpu_ms'] / t['server_cpu_ms']:.2f}×"
                 if i and t and i.get("server_cpu_ms") and t.get("server_cpu_ms") else "")
        lines.append(f"| {sc.label} | " + " | ".join(cs) + f" | {ratio} | {verdict(CPU_TARGETS.get(sc.name), i, t)} |")

    cold, rss = res.get("coldstart", {}), res.get("rss", {})
    if cold or rss:
        lines += ["", "| Worker lifecycle | " + " | ".join(title[s] for s in srv) + " | Target |",
                  "|" + "---|" * (len(srv) + 2)]

        def c_cell(s: str) -> str:
            c = cold.get(s)
            if not c:
                return "—"
            if "error" in c:
                return f"error: {c['error'][:80]}"
            return (f"{c['load_median_s']:.3f} s median ({c['load_min_s']:.3f}–{c['load_max_s']:.3f}, "
                    f"n={c['cycles']})")

        def r_cell(s: str) -> str:
            c = cold.get(s, {})
            if "new_process_rss_mb_median" in c:
                return f"{c['new_process_rss_mb_median']:.1f} MB RSS ({c['new_process_uss_mb_median']:.1f} MB USS)"
            return "—"

        def m_cell(s: str) -> str:
            r = rss.get(s)
            if not r:
                return "—"
            t = f"main {r['main_rss_mb']:.0f} MB"
            if "child_rss_mb_max" in r:
                t += f"; children ≤ {r['child_rss_mb_max']:.0f} MB RSS ({len(r['children'])})"
            return t

        cold_ok = cold.get("inferd", {}).get("load_median_s")
        rss_ok = cold.get("inferd", {}).get("new_process_rss_mb_median")
        lines.append("| Load `trivial` via repository API, request → ready | "
                     + " | ".join(c_cell(s) for s in srv)
                     + f" | {'✅' if cold_ok is not None and cold_ok <= 0.5 else '❌'} ≤ 0.5 s |")
        lines.append("| Idle worker RSS (the new `trivial` instance, 1 s after ready) | "
                     + " | ".join(r_cell(s) for s in srv)
                     + f" | {'✅' if rss_ok is not None and rss_ok <= 60 else '❌'} ≤ 60 MB |")
        lines.append("| Process RSS after the benchmark | " + " | ".join(m_cell(s) for s in srv) + " | |")
        if "inferd" in cold and cold["inferd"].get("log_load_s"):
            lines.append("")
            lines.append("inferd log, `successfully loaded 'trivial' … in`: "
                         + ", ".join(f"{x:.2f} s" for x in cold["inferd"]["log_load_s"]))

    prof = res.get("profile")
    if prof and "skipped" not in prof:
        lines += ["", "py-spy --native (inferd, HTTP add_sub c=16, separate run after the rounds; "
                  "% of busy samples, samples parked in epoll/poll excluded):", ""]
        for label, p in prof.items():
            if "error" in p:
                lines.append(f"- {label}: {p['error']}")
                continue
            busy = 100 * p["busy_samples"] / max(1, p["expected_samples_if_always_busy"])
            lines.append(f"- **{label}** ({p['busy_samples']} busy samples of {p['samples']}, ≈{busy:.0f}% of "
                         f"one core; {p['load_during_profile'].get('infer_per_s') or 0:.0f} infer/s while "
                         "profiled)")
            lines.append("  - by innermost Python frame (incl. native callees): "
                         + "; ".join(f"{r['frame']} {r['pct']}%" for r in p["python_self"][:8]))
            lines.append("  - by leaf (native): " + "; ".join(f"{r['frame']} {r['pct']}%" for r in p["leaf"][:6]))
            lines.append("  - inclusive: " + "; ".join(f"{r['frame']} {r['pct']}%" for r in p["inclusive"][3:11]))
    lines.append("")
    return "\n".join(lines)


def measure_point(s: Server, sc: Scenario, args: argparse.Namespace, http_body: Path, header_len: int | None,
                  req_index: dict, work: Path, neighbour: Neighbour | None) -> tuple[dict, dict]:
    """One point: (the client's result, CPU accounting: per request for the server's main process, its
    children and the client; cores used by the neighbour and by everything else on the machine)."""

    def snapshot() -> tuple[tuple[float, float], float, float, float, float]:
        return (s.cpu_seconds(), children_cpu(), neighbour.cpu_seconds() if neighbour else 0.0,
                system_busy(), time.monotonic())

    if sc.proto == "http":
        url = f"{s.base}/v2/models/{sc.model}/infer"
        if args.warmup > 0:
            run_wrk(url, sc.conc, args.warmup, http_body, header_len)
        before = snapshot()
        r = run_wrk(url, sc.conc, args.duration, http_body, header_len)
    else:
        san = s.info.get("grpc_sanity", {}).get(sc.model, {})
        if not san.get("ok"):
            return {"error": f"gRPC sanity failed: {san.get('error') or s.info.get('grpc_sanity')}"}, {}
        url, body = f"http://{s.grpc_url}", Path(req_index[sc.model]["path"])
        if args.warmup > 0:
            warm_h2load(url, sc.conc, args.warmup, body)
        before = snapshot()
        r = run_h2load(url, sc.conc, args.duration, body, san["response_framed_bytes"], work)
    after = snapshot()
    (cpu0, c0, n0, b0, t0), (cpu1, c1, n1, b1, t1) = before, after
    wall = max(1e-9, t1 - t0)
    # CPU used by everything else on the machine meanwhile (other engineers' runs)
    ours = (cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1]) + (c1 - c0) + (n1 - n0)
    used: dict = {"foreign_cores": round(max(0.0, (b1 - b0) - ours) / wall, 2)}
    if neighbour is not None:
        used["neighbour_cores"] = round((n1 - n0) / wall, 2)
        used["neighbour_cpu"] = neighbour.cpu
    if "error" not in r and r["requests"]:
        n = r["requests"]
        used["server_main_cpu_ms"] = 1e3 * (cpu1[0] - cpu0[0]) / n
        used["server_children_cpu_ms"] = 1e3 * (cpu1[1] - cpu0[1]) / n
        used["client_cpu_ms"] = 1e3 * (c1 - c0) / n
        if sc.model == "identity_4mib":
            used["mb_per_s"] = r["infer_per_s"] * IDENTITY_BYTES / 1e6
    return r, used


# ----------------------------------------------------------------------------------------------
# main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="inferd,triton,mlserver",
                    help="comma list, run in this order (inferd-nopoll: inferd with --busy-poll-us 0)")
    ap.add_argument("--scenarios", default=",".join([s.name for s in SCENARIOS] + EXTRA),
                    help="comma list of: " + ", ".join([s.name for s in SCENARIOS] + EXTRA))
    ap.add_argument("-d", "--duration", type=float, default=10.0, help="seconds per measured point")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up before each point")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--coldstart-cycles", type=int, default=5)
    ap.add_argument("--http-body", choices=["json", "binary"], default="json",
                    help="json works for all three servers; binary (Inference-Header-Content-Length) "
                         "skips MLServer for HTTP")
    ap.add_argument("--profile", action="store_true", help="py-spy the inferd supervisor and add_sub worker "
                    "on HTTP add_sub c=16 after the rounds")
    ap.add_argument("--install-peers", action="store_true", help="install MLServer + Triton reference first")
    ap.add_argument("--port-base", type=int, default=18600)
    ap.add_argument("--busy-cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the CPU the neighbour process of the *_busy scenarios spins on (default: the last)")
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--no-record", action="store_true", help="don't append to bench/RESULTS.md")
    ap.add_argument("--out", type=Path, help="JSON output (default bench/results/<date>-<commit>.json)")
    args = ap.parse_args()

    if args.install_peers:
        install_peers()
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    wanted = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    unknown = wanted - {s.name for s in SCENARIOS} - set(EXTRA)
    if unknown:
        ap.error(f"unknown scenarios: {sorted(unknown)}")
    scenarios = [s for s in SCENARIOS if s.name in wanted]
    for tool in ("wrk", "h2load"):
        if shutil.which(tool) is None:
            print(f"warning: {tool} not found; its scenarios will be reported as errors", flush=True)

    stamp = datetime.now(timezone.utc)
    commit = git_commit()
    work = BENCH / "out" / stamp.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    prepare_repo(repo)

    # request bodies
    built = subprocess.run([str(VENV_PY), str(BENCH / "grpc_tool.py"), "build", "--out-dir", str(work / "req")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        print(built.stderr, file=sys.stderr)
        return 1
    req_index = json.loads(built.stdout)
    a = list(range(16))
    if args.http_body == "json":
        http_body = work / "req" / "add_sub.json"
        http_body.write_text(json.dumps({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": a},
            {"name": "INPUT1", "datatype": "FP32", "shape": [16], "data": [1] * 16}]}, separators=(",", ":")))
        header_len = None
    else:
        import struct
        hdr = json.dumps({"inputs": [
            {"name": n, "datatype": "FP32", "shape": [16], "parameters": {"binary_data_size": 64}}
            for n in ("INPUT0", "INPUT1")],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")]},
            separators=(",", ":")).encode()
        raw = struct.pack("<16f", *a) + struct.pack("<16f", *([1.0] * 16))
        http_body = work / "req" / "add_sub.bin"
        http_body.write_bytes(hdr + raw)
        header_len = len(hdr)

    servers = [Server(n, (args.port_base + 10 * i, args.port_base + 10 * i + 1, args.port_base + 10 * i + 2), work)
               for i, n in enumerate(names)]
    res: dict = {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit, "machine": machine(),
                 "command": shlex.join([".venv/bin/python", "bench/run.py", *sys.argv[1:]]),
                 "tools": versions(), "servers": names, "duration_s": args.duration, "warmup_s": args.warmup,
                 "rounds": args.rounds, "http_body": args.http_body, "requests": req_index,
                 "loadavg_start": loadavg(), "skipped": {}, "points": [], "scenario_list": scenarios}
    try:
        for s in servers:
            print(f"== starting {s.name} on {s.ports}", flush=True)
            s.start(repo, args.start_timeout)
            if s.skipped:
                print(f"   skipped: {s.skipped}", flush=True)
                res["skipped"][s.name] = s.skipped
                continue
            print(f"   ready in {s.startup_s:.1f} s", flush=True)
            san = subprocess.run([str(VENV_PY), str(BENCH / "grpc_tool.py"), "sanity", "--url", s.grpc_url,
                                  "--out-dir", str(work / "req")], capture_output=True, text=True, timeout=300)
            s.info["grpc_sanity"] = json.loads(san.stdout) if san.returncode == 0 else {"error": san.stderr[-500:]}
            code, body = http("POST", f"{s.base}/v2/models/add_sub/infer", http_body.read_bytes(), timeout=10)
            s.info["http_sanity"] = {"status": code, "body": body[:300].decode(errors="replace")}
            print(f"   sanity: http {code}, grpc {json.dumps(s.info['grpc_sanity'])[:300]}", flush=True)
        live = [s for s in servers if not s.skipped]

        if "coldstart" in wanted:
            res["coldstart"] = {}
            for s in live:
                if s.name == "mlserver":
                    continue  # in-process models (workers=0): nothing is spawned
                print(f"== cold start: {s.name}", flush=True)
                res["coldstart"][s.name] = c = measure_coldstart(s, args.coldstart_cycles)
                print(f"   {json.dumps({k: v for k, v in c.items() if k != 'new_process_rss'})[:300]}",
                      flush=True)

        for rnd in range(1, args.rounds + 1):
            # even rounds take the servers in reverse, so that no server is always measured first or
            # always after the same one (on this host a point can read differently by what ran before it)
            order = live if rnd % 2 else live[::-1]
            for sc in scenarios:
                for s in order:
                    if sc.proto == "http" and s.name == "mlserver" and header_len is not None:
                        continue
                    point: dict = {"round": rnd, "scenario": sc.name, "server": s.name, "loadavg": loadavg()}
                    neighbour = Neighbour(args.busy_cpu) if sc.busy else None
                    try:
                        r, used = measure_point(s, sc, args, http_body, header_len, req_index, work, neighbour)
                    finally:
                        if neighbour is not None:
                            neighbour.stop()  # reaped between points: its CPU never counts as the client's
                    point.update(r)
                    point.update(used)
                    res["points"].append(point)
                    show = (f"{point.get('mb_per_s', 0):.0f} MB/s " if "mb_per_s" in point else "") + (
                        f"{point['infer_per_s']:.0f}/s p50 {point['p50_ms']:.2f} p99 {point['p99_ms']:.2f} ms"
                        if "error" not in point else point["error"])
                    show += f"  (other load {point.get('foreign_cores', 0):.2f} cores"
                    if "neighbour_cores" in point:
                        show += f", neighbour {point['neighbour_cores']:.2f} on CPU {point['neighbour_cpu']}"
                    show += ")"
                    print(f"[r{rnd}] {sc.name:24s} {s.name:9s} {show}"
                          f"{'  INVALID: ' + point['invalid'] if 'invalid' in point else ''}", flush=True)

        if "rss" in wanted:
            res["rss"] = {s.name: measure_rss(s) for s in live}
        if args.profile and any(s.name == "inferd" for s in live):
            print("== profiling inferd (HTTP add_sub c=16)", flush=True)
            inferd = next(s for s in live if s.name == "inferd")
            res["profile"] = profile_inferd(inferd, args.duration, work, http_body, header_len)
    finally:
        for s in servers:
            s.stop()
    res["loadavg_end"] = loadavg()
    res["server_info"] = {s.name: {**s.info, "startup_s": s.startup_s} for s in servers}
    res["summary"] = {}
    for sc in scenarios:
        res["summary"][sc.name] = {}
        for s in names:
            pts = [p for p in res["points"] if p["scenario"] == sc.name and p["server"] == s]
            if pts:
                res["summary"][sc.name][s] = agg(pts)

    md = markdown(res)
    print("\n" + md)
    res["scenario_list"] = [s.name for s in scenarios]
    out = args.out or BENCH / "results" / f"{stamp.strftime('%Y%m%d-%H%M%S')}-{commit}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"JSON: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    if not args.no_record:
        results = BENCH / "RESULTS.md"
        if not results.exists():
            results.write_text("# Benchmark results\n\nAppended by `bench/run.py` (newest last). "
                               "See bench/README.md for method.\n\n")
        with open(results, "a") as f:
            f.write(md + f"\nRaw: `{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}`\n\n")
        print("appended to bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
