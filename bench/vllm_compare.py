"""inferd's vllm backend against vLLM's own OpenAI server, side by side in one run (issue 39 item 4).

    .venv/bin/python bench/vllm_compare.py                       # the recorded run
    .venv/bin/python bench/vllm_compare.py --conc 16 --rounds 1 --targets vllm,inferd-openai

Both servers serve the same tiny Llama (built on the spot by tests/e2e/vllm_support.py: random weights, a
tokenizer trained there, nothing downloaded) with the same engine arguments (vllm_support.ENGINE_ARGS), from
the same vLLM environment (--env, default tests/tools/vllm_env.sh's): vLLM's `python -m
vllm.entrypoints.openai.api_server`, and inferd serving a Triton vLLM repository (`backend: "vllm"`,
model.json) through its worker, with --openai-port. Both are up for the whole run; each point loads one
of them only, and the targets take turns (the order alternates by round), so a busy host hurts both alike.
--model-runner picks vLLM's executor for both servers alike (see its help; recorded in the JSON's args):
vLLM's default (a model-runner process) unless told.

Targets: `vllm` (vLLM's /v1/completions), `inferd-openai` (inferd's /v1/completions), `inferd-generate`
(POST /v2/models/llm/generate_stream) and `inferd-grpc` (ModelStreamInfer, one stream per request). Every
request streams --tokens output tokens (ignore_eos, temperature 0) for the same prompt. A point is --conc c
closed-loop clients, each sending --requests requests back to back (c=1: --requests-c1). Output tokens/s =
tokens / (first send .. last answer); TTFT = send -> first streamed chunk; ITL = gaps between a request's
chunks. The client is Python asyncio (uvloop) + aiohttp / tritonclient.grpc.aio, the same for every target;
it shares the CPUs with the servers, and the CPU of other processes meanwhile is reported ("others").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests" / "e2e"))
import vllm_support  # noqa: E402  (tests/e2e/vllm_support.py: the tiny Llama and the engine arguments)
from openai_stream import free_ports  # noqa: E402
from run import INFERD, ROOT, git_commit, loadavg, machine, system_busy  # noqa: E402

MODEL = "llm"
PROMPT = "The quick brown fox"
TARGETS = ("vllm", "inferd-openai", "inferd-generate", "inferd-grpc")


# ---------------------------------------------------------------------------------------------- servers

class Proc:
    """A server process in a session of its own (killed with its children at the end)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ok(self, urls: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log.name}: the server exited: {self.log.read_text()[-3000:]}")
            try:
                if all(urllib.request.urlopen(u, timeout=2).status == 200 for u in urls):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.log.name}: not ready in {timeout} s: {self.log.read_text()[-3000:]}")

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: (the frontend: vLLM's API server, or inferd's supervisor and worker; the
        engine: vLLM's engine core and model-runner processes, named VLLM::...)."""
        front = engine = 0.0
        for p in [self.ps, *self.ps.children(recursive=True)]:
            try:
                t = p.cpu_times()
                if p.name().startswith("VLLM::"):
                    engine += t.user + t.system
                else:
                    front += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return front, engine

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def vllm_cli_args(engine: dict[str, Any]) -> list[str]:
    """ENGINE_ARGS as the api_server's flags."""
    argv = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def start_vllm(python: str, model: Path, port: int, work: Path) -> Proc:
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port), *vllm_cli_args(vllm_support.ENGINE_ARGS)]
    return Proc(argv, work / "vllm-server.log")


def build_repo(work: Path, model: Path, env_path: str) -> Path:
    folder = work / "models" / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.json").write_text(json.dumps({"model": str(model), **vllm_support.ENGINE_ARGS}))
    params = 'parameters { key: "tokenizer" value: { string_value: "%s" } }\n' % model
    if env_path:
        params += 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }\n' % env_path
    (folder / "config.pbtxt").write_text('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n'
                                         + params)
    return work / "models"


class Inferd(Proc):
    def __init__(self, repo: Path, work: Path) -> None:
        self.http, self.grpc, metrics, self.openai = free_ports(4)
        super().__init__([str(INFERD), "--model-repository", str(repo), "--http-port", str(self.http),
                          "--grpc-port", str(self.grpc), "--metrics-port", str(metrics), "--openai-port",
                          str(self.openai), "--openai-address", "127.0.0.1"], work / "inferd-server.log")


# ---------------------------------------------------------------------------------------------- client

class Rec:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.chunks = 0


def _sampling(tokens: int) -> dict[str, Any]:
    return {"max_tokens": tokens, "ignore_eos": True, "temperature": 0}


async def sse(session: aiohttp.ClientSession, url: str, body: bytes, key: str, rec: Rec) -> None:
    sent = time.perf_counter()
    arrivals = []
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = orjson.loads(payload)
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            if key == "choices" and not event.get("choices"):
                continue
            arrivals.append(time.perf_counter())
    _record(rec, sent, arrivals)


def _record(rec: Rec, sent: float, arrivals: list[float]) -> None:
    if not arrivals:
        raise RuntimeError("a request got no streamed chunk")
    rec.ttft.append(arrivals[0] - sent)
    rec.itl.extend(b - a for a, b in zip(arrivals, arrivals[1:]))
    rec.chunks += len(arrivals)


class Client:
    """One target's requests."""

    def __init__(self, target: str, vllm_port: int, inferd: Inferd, tokens: int) -> None:
        self.target = target
        self.tokens = tokens
        if target in ("vllm", "inferd-openai"):
            port = vllm_port if target == "vllm" else inferd.openai
            self.url = f"http://127.0.0.1:{port}/v1/completions"
            self.body = orjson.dumps({"model": MODEL, "prompt": PROMPT, "stream": True, **_sampling(tokens)})
        elif target == "inferd-generate":
            self.url = f"http://127.0.0.1:{inferd.http}/v2/models/{MODEL}/generate_stream"
            self.body = orjson.dumps({"text_input": PROMPT, "stream": True, "exclude_input_in_output": True,
                                      "sampling_parameters": json.dumps(_sampling(tokens))})
        else:
            self.url = f"127.0.0.1:{inferd.grpc}"
        self.server_proc: Proc = inferd

    async def __aenter__(self) -> Client:
        if self.target == "inferd-grpc":
            import tritonclient.grpc.aio as grpcaio

            self.grpc = grpcaio.InferenceServerClient(self.url)
            self.inputs = []
            for name, value, dtype in (("text_input", PROMPT.encode(), "BYTES"), ("stream", True, "BOOL"),
                                       ("exclude_input_in_output", True, "BOOL"),
                                       ("sampling_parameters", json.dumps(_sampling(self.tokens)).encode(),
                                        "BYTES")):
                tensor = grpcaio.InferInput(name, [1], dtype)
                tensor.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
                self.inputs.append(tensor)
        else:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                 timeout=aiohttp.ClientTimeout(total=600))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.target == "inferd-grpc":
            await self.grpc.close()
        else:
            await self.session.close()

    async def one(self, rec: Rec) -> None:
        if self.target != "inferd-grpc":
            await sse(self.session, self.url, self.body, "choices" if "generate" not in self.target else "", rec)
            return

        async def requests():  # one request on its own stream
            yield {"model_name": MODEL, "inputs": self.inputs, "enable_empty_final_response": True}

        sent = time.perf_counter()
        arrivals = []
        async for result, error in self.grpc.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(f"gRPC: {error}")
            response = result.get_response()
            if result.as_numpy("text_output") is not None:
                arrivals.append(time.perf_counter())
            if response.parameters["triton_final_response"].bool_param:
                break
        _record(rec, sent, arrivals)


async def run_point(client: Client, server: Proc, conc: int, requests: int) -> dict[str, Any]:
    rec = Rec()
    await client.one(Rec())  # a warm-up request (connections, the server's first-request paths)

    async def user() -> None:
        for _ in range(requests):
            await client.one(rec)

    busy0, (front0, engine0), t0 = system_busy(), server.cpu(), time.perf_counter()
    await asyncio.gather(*(user() for _ in range(conc)))
    elapsed = time.perf_counter() - t0
    busy1, (front1, engine1) = system_busy(), server.cpu()
    front, engine = front1 - front0, engine1 - engine0
    tokens = conc * requests * client.tokens
    itl = sorted(rec.itl)
    return {"target": client.target, "conc": conc, "requests": conc * requests, "tokens": tokens,
            "chunks_per_request": rec.chunks / (conc * requests), "elapsed_s": elapsed,
            "tokens_per_s": tokens / elapsed, "server_cores": (front + engine) / elapsed,
            "frontend_us_per_token": front / tokens * 1e6, "engine_us_per_token": engine / tokens * 1e6,
            # CPU of every other process (the client included) meanwhile: the host is shared
            "others_cores": max(0.0, (busy1 - busy0) - front - engine) / elapsed,
            "ttft_p50_ms": statistics.median(rec.ttft) * 1e3, "ttft_p90_ms": _pct(sorted(rec.ttft), 0.9) * 1e3,
            "itl_p50_ms": statistics.median(itl) * 1e3 if itl else None,
            "itl_p90_ms": _pct(itl, 0.9) * 1e3 if itl else None}


def _pct(values: list[float], q: float) -> float:
    return values[int(q * (len(values) - 1))]


# ---------------------------------------------------------------------------------------------- report

def summarize(points: list[dict], concs: list[int], targets: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for conc in concs:
        row: dict[str, Any] = {}
        for target in targets:
            pts = [p for p in points if p["target"] == target and p["conc"] == conc]
            if pts:
                row[target] = {k: statistics.median(p[k] for p in pts) for k in
                               ("tokens_per_s", "ttft_p50_ms", "itl_p50_ms", "server_cores", "others_cores",
                                "frontend_us_per_token", "engine_us_per_token")}
        base = row.get("vllm")
        if base:
            for r in row.values():
                r["tokens_x_vllm"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["ttft_x_vllm"] = r["ttft_p50_ms"] / base["ttft_p50_ms"]
        out[str(conc)] = row
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'c':>3} {'target':<16} {'tok/s':>8} {'x vLLM':>6} | {'TTFT p50':>9} {'x vLLM':>6} | "
             f"{'ITL p50':>8} | {'front us/tok':>12} {'engine us/tok':>13} | {'server cores':>12} {'others':>6}"]
    for conc, row in summary.items():
        for target, r in row.items():
            lines.append(f"{conc:>3} {target:<16} {r['tokens_per_s']:>8.0f} {r.get('tokens_x_vllm', 0):>6.2f} | "
                         f"{r['ttft_p50_ms']:>7.1f}ms {r.get('ttft_x_vllm', 0):>6.2f} | "
                         f"{r['itl_p50_ms'] or 0:>6.2f}ms | {r['frontend_us_per_token']:>12.0f} "
                         f"{r['engine_us_per_token']:>13.0f} | "
                         f"{r['server_cores']:>12.2f} {r['others_cores']:>6.2f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main

def cpu_pressure() -> str:
    """/proc/pressure/cpu's first line: the share of time some task waited for a CPU (a saturated host)."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "?"


async def measure(args: argparse.Namespace, vllm_port: int, vllm: Proc, inferd: Inferd) -> list[dict]:
    points = []
    for rnd in range(args.rounds):
        for conc in args.conc:
            order = args.targets if rnd % 2 == 0 else args.targets[::-1]
            for target in order:
                server = vllm if target == "vllm" else inferd
                async with Client(target, vllm_port, inferd, args.tokens) as client:
                    point = await run_point(client, server, conc, args.requests_c1 if conc == 1 else args.requests)
                point["round"] = rnd
                points.append(point)
                print(f"  round {rnd} c={conc:<3} {target:<16} {point['tokens_per_s']:>7.0f} tok/s  TTFT p50 "
                      f"{point['ttft_p50_ms']:7.1f} ms  ITL p50 {point['itl_p50_ms'] or 0:6.2f} ms  front "
                      f"{point['frontend_us_per_token']:.0f} us/tok, engine {point['engine_us_per_token']:.0f} us/tok, "
                      f"{point['server_cores']:.2f} cores, others {point['others_cores']:.2f}", file=sys.stderr)
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default=os.environ.get(vllm_support.ENV_VAR) or os.path.expanduser(
        "~/.cache/inferd-vllm-env"), help="the vLLM environment (a virtual environment directory)")
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 32])
    ap.add_argument("--targets", type=lambda s: s.split(","), default=list(TARGETS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request (ignore_eos)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client at c > 1")
    ap.add_argument("--requests-c1", type=int, default=8, help="requests at c = 1")
    ap.add_argument("--json", type=Path, help="also write the points and summary here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (model, logs)")
    ap.add_argument("--commit", help="the commit to record (run from a copy of the tree without .git)")
    ap.add_argument("--model-runner", choices=["in-engine", "process"], default="process",
                    help="where vLLM's CPU model runner runs, for both servers alike: inside the engine core "
                    "process (VLLM_ENABLE_V1_MULTIPROCESSING=0, vLLM's uniprocess executor) or in a process of "
                    "its own (vLLM's default multiprocess executor, whose shared-memory reads busy-poll for a "
                    "second after each read: on a 2-vCPU host that poll and the model's OpenMP threads hold both "
                    "cores and streams arrive in bursts at their end, for either server)")
    args = ap.parse_args()
    if args.model_runner == "in-engine":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # both servers inherit it
    else:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    python = os.path.join(args.env, "bin", "python")
    work = Path(tempfile.mkdtemp(prefix="vllm-compare-"))
    model = work / "tiny"
    vllm_support.make_tiny_llama(python, model)
    (vllm_port,) = free_ports(1)
    load0, psi0 = loadavg(), cpu_pressure()
    servers: list[Proc] = []
    try:  # one engine starts at a time (each takes the CPUs for ~30 s)
        vllm = start_vllm(python, model, vllm_port, work)
        servers.append(vllm)
        vllm.wait_ok([f"http://127.0.0.1:{vllm_port}/v1/models"], 600)
        inferd = Inferd(build_repo(work, model, args.env), work)
        servers.append(inferd)
        inferd.wait_ok([f"http://127.0.0.1:{inferd.http}/v2/models/{MODEL}/ready",
                        f"http://127.0.0.1:{inferd.openai}/v1/models"], 600)
        print(f"both servers ready; load average {loadavg()}", file=sys.stderr)
        points = asyncio.run(measure(args, vllm_port, vllm, inferd))
    finally:
        for server in servers:
            server.stop()
    summary = summarize(points, args.conc, args.targets)
    print(table(summary))
    print(f"load average {load0} -> {loadavg()}; cpu pressure {psi0} -> {cpu_pressure()}")
    result = {"commit": args.commit or git_commit(), "machine": machine(), "load_before": load0,
              "load_after": loadavg(), "cpu_pressure_before": psi0, "cpu_pressure_after": cpu_pressure(),
              "args": {k: v for k, v in vars(args).items() if k != "json"}, "points": points, "summary": summary}
    result["args"]["env"] = str(args.env)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    if args.keep:
        print(f"scratch: {work}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    _ = ROOT
    sys.exit(main())
