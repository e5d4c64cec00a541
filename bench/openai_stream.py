"""Streamed tokens through the OpenAI API against Triton's generate_stream, on one model and one client
(issue 37 item 8).

    .venv/bin/python bench/openai_stream.py                  # the recorded run: 3 rounds of 8 s points
    .venv/bin/python bench/openai_stream.py -d 3 --rounds 1 --json
    .venv/bin/python bench/openai_stream.py --ttft-only --rounds 3 --latency-requests 100   # TTFT at c=1 only

One inferd (--openai-port) serves two copies of tests/fixtures/models/llm_trtllm, each with a tokenizer
built by tests/openai_support.py:
- `llm_fast` emits its tokens at no cost (a decoupled Python model sending one response per token);
- `llm_10ms` emits one token every 10 ms on a steady cadence (token i at start + (i+1) x 10 ms, as an
  engine's decode steps) and stamps each token with the request's arrival in execute() and the token's send
  time (time.monotonic_ns, the clock the client reads too).

Throughput: c = 1, 16, 64 closed-loop streams, each request asking for --tokens tokens ("COUNT:n"), for
POST /v1/chat/completions (stream: true) and POST /v2/models/<m>/generate_stream, back to back in each
round (order alternating). Tokens/s = tokens received / time from the first request to the last answer;
server CPU per token = CPU seconds of the server process and its workers over that time / tokens.
Latency (llm_10ms), from the stamps: TTFT added = TTFT minus the model's own time to its first token
(execute() to the first send: the 10 ms and the model's thread start), split into the request's way in
(client send to execute()) and the first token's way out; "delivery" = each token's arrival at the client
minus its send time in the model (what the server adds to every token); inter-token latency (the gaps
between a request's tokens) minus the model's 10 ms. c=1 and c=16. TTFT - 10 ms is printed too.
For chat, completions and generate_stream (--latency-tokens tokens a request).

How TTFT is taken: the aiohttp client keeps its connections (streams leave the connection open, as Triton's
generate_stream and as the OpenAI SDK's httpx client and AIPerf expect), so its c=1 figure has no TCP connect,
but it does hold aiohttp's own per-request work on both sides of the server (≈0.3-0.5 ms on a 2-vCPU host).
The bare asyncio client (no HTTP library: one write, readline) measures the first token twice: on a new TCP
connection per request (connect + way in + way out) and on one kept connection (way in + way out), the
closest to what the server itself adds.

The client is Python asyncio (uvloop) + aiohttp, parsing every SSE event with orjson; it shares the
2 CPUs with the server, so its CPU is reported too. Targets (issue 37): chat >= 0.9x generate_stream's
tokens/s at each c, >= 20,000 tokens/s at c=64, added TTFT <= 1 ms p50 at c=1, added ITL <= 0.3 ms p50 at
c=16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))
import openai_support  # noqa: E402  (tests/openai_support.py: tokenizers and fixture parameters)
from run import INFERD, ROOT, git_commit, loadavg, machine, system_busy  # noqa: E402  (bench/ is not a package)

FIXTURE = ROOT / "tests" / "fixtures" / "models" / "llm_trtllm"
MODEL_DELAY_S = 0.010
KINDS = ("chat", "generate_stream")  # the throughput points
LATENCY_KINDS = ("chat", "completions", "generate_stream")  # the 10 ms model's points


# ---------------------------------------------------------------------------------------------- server

def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def build_repo(root: Path) -> Path:
    repo = root / "models"
    for name, params in (("llm_fast", {}), ("llm_10ms", {"token_delay_ms": "10", "stamp_tokens": "1"})):
        dest = repo / name
        shutil.copytree(FIXTURE, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
        config = dest / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "llm_trtllm"', f'name: "{name}"', 1))
        tok = openai_support.build_tokenizer(dest / "tokenizer")
        openai_support.set_parameters(dest, {"tokenizer": str(tok), **params})
    return repo


class Server:
    def __init__(self, repo: Path, logdir: Path) -> None:
        self.http, grpc, metrics, self.openai = free_ports(4)
        argv = [str(INFERD), "--model-repository", str(repo), "--http-port", str(self.http),
                "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--openai-port", str(self.openai),
                "--openai-address", "127.0.0.1"]
        self.log = logdir / "server.log"
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 60.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        urls = [f"http://127.0.0.1:{self.http}/v2/models/{m}/ready" for m in ("llm_fast", "llm_10ms")]
        urls.append(f"http://127.0.0.1:{self.openai}/v1/models")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-2000:]}")
            try:
                if all(urllib.request.urlopen(u, timeout=2).status == 200 for u in urls):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready in {timeout} s: {self.log.read_text()[-2000:]}")

    def cpu(self) -> float:
        """CPU seconds of the server and its workers so far."""
        total = 0.0
        for p in [self.ps, *self.ps.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# ---------------------------------------------------------------------------------------------- client

class Target:
    """One endpoint: its URL, request body and how to read a token's text out of an SSE event."""

    def __init__(self, kind: str, server: Server, model: str, tokens: int) -> None:
        self.kind = kind
        if kind == "chat":
            self.port, self.path = server.openai, "/v1/chat/completions"
            body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": tokens,
                                    "messages": [{"role": "user", "content": f"COUNT:{tokens}"}]}
        elif kind == "completions":
            self.port, self.path = server.openai, "/v1/completions"
            body = {"model": model, "stream": True, "max_tokens": tokens, "prompt": f"COUNT:{tokens}"}
        else:
            self.port, self.path = server.http, f"/v2/models/{model}/generate_stream"
            body = {"text_input": f"COUNT:{tokens}", "max_tokens": tokens, "stream": True}
        self.url = f"http://127.0.0.1:{self.port}{self.path}"
        self.body = orjson.dumps(body)

    def text(self, event: dict) -> str | None:
        if self.kind == "chat":
            choices = event.get("choices")
            return choices[0]["delta"].get("content") if choices else None
        if self.kind == "completions":
            choices = event.get("choices")
            return choices[0].get("text") if choices else None
        if "error" in event:
            raise RuntimeError(f"generate_stream error: {event['error']}")
        return event.get("text_output")


async def stream_one(session: aiohttp.ClientSession, target: Target, rec: dict) -> None:
    """One request: token arrival times (perf_counter) and, for stamped tokens, the request's way in, the
    model's own time to its first token and every token's delivery (ns)."""
    sent_ns = time.monotonic_ns()
    sent = time.perf_counter()
    arrivals: list[float] = []
    async with session.post(target.url, data=target.body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{target.kind}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            now_ns = time.monotonic_ns()
            now = time.perf_counter()
            text = target.text(orjson.loads(payload))
            if not text:
                continue
            if rec["stamped"]:
                arrived_ns, token_ns = (int(v) for v in text.split(":"))
                rec["delivery_ns"].append(now_ns - token_ns)
                if not arrivals:
                    rec["way_in_ns"].append(arrived_ns - sent_ns)
                    rec["model_ns"].append(token_ns - arrived_ns)
                    rec["ttft_added_ns"].append(now_ns - sent_ns - (token_ns - arrived_ns))
            arrivals.append(now)
    if not arrivals:
        raise RuntimeError(f"{target.kind}: a request got no tokens")
    rec["tokens"] += len(arrivals)
    rec["ttft"].append(arrivals[0] - sent)
    rec["itl"].extend(b - a for a, b in zip(arrivals, arrivals[1:]))


async def run_point(target: Target, conc: int, duration: float, stamped: bool, server: Server,
                    max_requests: int | None = None) -> dict:
    rec: dict[str, Any] = {"tokens": 0, "ttft": [], "itl": [], "delivery_ns": [], "way_in_ns": [], "model_ns": [],
                           "ttft_added_ns": [], "stamped": stamped, "requests": 0}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await stream_one(session, target, {**rec, **{k: [] for k in rec if isinstance(rec[k], list)},
                                           "tokens": 0})  # a warm-up request, not counted
        deadline = time.perf_counter() + duration

        async def loop() -> None:
            while time.perf_counter() < deadline and (max_requests is None or rec["requests"] < max_requests):
                rec["requests"] += 1
                await stream_one(session, target, rec)

        busy0, cpu0, self0, t0 = system_busy(), server.cpu(), resource.getrusage(resource.RUSAGE_SELF), \
            time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(conc)))
        elapsed = time.perf_counter() - t0
        busy1, cpu1, self1 = system_busy(), server.cpu(), resource.getrusage(resource.RUSAGE_SELF)
    client_cpu = (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime)
    tokens = rec["tokens"]
    out = {"kind": target.kind, "conc": conc, "requests": rec["requests"], "tokens": tokens,
           "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed,
           "server_cpu_us_per_token": (cpu1 - cpu0) / tokens * 1e6, "server_cores": (cpu1 - cpu0) / elapsed,
           "client_cores": client_cpu / elapsed,
           # CPU that other processes on the machine used meanwhile (a shared 2-vCPU host)
           "foreign_cores": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - client_cpu) / elapsed,
           "ttft_p50_ms": statistics.median(rec["ttft"]) * 1e3,
           "itl_p50_ms": statistics.median(rec["itl"]) * 1e3 if rec["itl"] else None}
    if stamped:
        for key in ("delivery", "way_in", "model", "ttft_added"):
            out[f"{key}_p50_ms"] = statistics.median(rec[f"{key}_ns"]) / 1e6
        out["delivery_p90_ms"] = sorted(rec["delivery_ns"])[int(0.9 * (len(rec["delivery_ns"]) - 1))] / 1e6
    return out


def _raw_request(target: Target) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (target.path.encode(), len(target.body), target.body))


async def raw_first_token(target: Target, conn: tuple[Any, Any] | None = None) -> tuple[float, float, float]:
    """One request on a bare asyncio connection (no HTTP client library): (TCP connect, way in from the
    request written to the model's execute(), the first token's way out), in ms. `conn`: a kept connection
    (reader, writer) to send it on (connect 0; the stream is read to its end, the connection stays open);
    None: a connection of its own, closed after the first token."""
    t0 = time.monotonic_ns()
    reader, writer = conn if conn is not None else await asyncio.open_connection("127.0.0.1", target.port)
    t1 = time.monotonic_ns() if conn is None else t0
    writer.write(_raw_request(target))
    t2 = time.monotonic_ns()
    got: tuple[float, float, float] | None = None
    try:
        while line := await reader.readline():
            if got is None and line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                now = time.monotonic_ns()
                text = target.text(orjson.loads(line[6:]))
                if text:
                    arrived_ns, token_ns = (int(v) for v in text.split(":"))
                    got = (t1 - t0) / 1e6, (arrived_ns - t2) / 1e6, (now - token_ns) / 1e6
                    if conn is None:
                        return got
            elif line == b"0\r\n":  # the last chunk: the stream is over, the connection kept
                await reader.readline()
                break
    finally:
        if conn is None:
            writer.close()
    if got is None:
        raise RuntimeError(f"{target.kind}: no token")
    return got


async def raw_point(server: Server, kind: str, requests: int, kept: bool = False) -> dict:
    """`requests` first tokens at c=1 by the bare client, each on a connection of its own (as a client that
    does not keep connections: TCP connect included) or, `kept`, all on one kept connection (as the OpenAI
    SDK's and AIPerf's HTTP clients keep theirs: no connect)."""
    target = Target(kind, server, "llm_10ms", 2)
    conn = await asyncio.open_connection("127.0.0.1", target.port) if kept else None
    try:
        samples = [await raw_first_token(target, conn) for _ in range(requests + 1)][1:]
    finally:
        if conn is not None:
            conn[1].close()
    cols = list(zip(*samples))
    return {"kind": kind, "kept": kept, "requests": requests, "connect_p50_ms": statistics.median(cols[0]),
            "way_in_p50_ms": statistics.median(cols[1]), "way_out_p50_ms": statistics.median(cols[2]),
            "ttft_added_p50_ms": statistics.median(a + b + c for a, b, c in samples)}


# ---------------------------------------------------------------------------------------------- report

def median_of(points: list[dict], key: str) -> Any:
    """The median of `key` over the points that have it (None when none has it)."""
    values = [p[key] for p in points if p.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(results: dict) -> dict:
    summary: dict[str, Any] = {"throughput": {}, "latency": {}}
    for conc in [] if results["args"]["ttft_only"] else results["args"]["conc"]:
        row: dict[str, Any] = {}
        for kind in KINDS:
            pts = [p for p in results["throughput"] if p["kind"] == kind and p["conc"] == conc]
            row[kind] = {k: median_of(pts, k) for k in ("tokens_per_s", "server_cpu_us_per_token", "server_cores",
                                                          "client_cores", "foreign_cores")}
        row["ratio"] = row["chat"]["tokens_per_s"] / row["generate_stream"]["tokens_per_s"]
        summary["throughput"][conc] = row
    for key, kept in (("raw_client_c1", False), ("raw_kept_c1", True)):
        summary[key] = {kind: {k: median_of([p for p in results["raw"] if p["kind"] == kind
                                             and p.get("kept", False) == kept], k)
                               for k in ("connect_p50_ms", "way_in_p50_ms", "way_out_p50_ms", "ttft_added_p50_ms")}
                        for kind in LATENCY_KINDS}

    def minus_model(value: float | None) -> float | None:
        return None if value is None else value - MODEL_DELAY_S * 1e3

    for kind in LATENCY_KINDS:
        c1 = [p for p in results["latency"] if p["kind"] == kind and p["conc"] == 1]
        c16 = [p for p in results["latency"] if p["kind"] == kind and p["conc"] == 16]
        summary["latency"][kind] = {
            "ttft_added_p50_ms_c1": median_of(c1, "ttft_added_p50_ms"),
            "way_in_p50_ms_c1": median_of(c1, "way_in_p50_ms"),
            "model_own_p50_ms_c1": median_of(c1, "model_p50_ms"),
            "ttft_minus_10_p50_ms_c1": minus_model(median_of(c1, "ttft_p50_ms")),
            "ttft_added_p50_ms_c16": median_of(c16, "ttft_added_p50_ms"),
            "itl_added_p50_ms_c16": minus_model(median_of(c16, "itl_p50_ms")),
            "delivery_p50_ms_c1": median_of(c1, "delivery_p50_ms"),
            "delivery_p50_ms_c16": median_of(c16, "delivery_p50_ms"),
            "delivery_p90_ms_c16": median_of(c16, "delivery_p90_ms"),
        }
    t, lat = summary["throughput"], summary["latency"]["chat"]
    kept = summary["raw_kept_c1"]["chat"]["ttft_added_p50_ms"]
    summary["targets"] = {
        "chat >= 0.9x generate_stream (every c)": all(r["ratio"] >= 0.9 for r in t.values()) if t else None,
        "chat >= 20000 tokens/s at c=64": t[64]["chat"]["tokens_per_s"] >= 20000 if 64 in t else None,
        "added TTFT <= 1 ms p50 at c=1 (aiohttp client, kept connection)": lat["ttft_added_p50_ms_c1"] <= 1.0,
        "added TTFT <= 1 ms p50 at c=1 (bare client, kept connection)": kept <= 1.0 if kept is not None else None,
        "added ITL <= 0.3 ms p50 at c=16": (lat["itl_added_p50_ms_c16"] <= 0.3
                                            if lat["itl_added_p50_ms_c16"] is not None else None),
    }
    return summary


def _ms(value: float | None, width: int, digits: int = 3) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def table(summary: dict) -> str:
    lines = ["streamed tokens/s (median of rounds), no-cost model, server CPU per token",
             f"{'c':>4} | {'chat tok/s':>11} {'us/tok':>7} | {'gen_stream tok/s':>16} {'us/tok':>7} | "
             f"{'ratio':>5} | {'client cores':>12} | {'others cores':>12}"]
    for conc, row in summary["throughput"].items():
        ch, gs = row["chat"], row["generate_stream"]
        lines.append(f"{conc:>4} | {ch['tokens_per_s']:>11,.0f} {ch['server_cpu_us_per_token']:>7.1f} | "
                     f"{gs['tokens_per_s']:>16,.0f} {gs['server_cpu_us_per_token']:>7.1f} | "
                     f"{row['ratio']:>5.2f} | {ch['client_cores']:>5.2f} / {gs['client_cores']:<5.2f}| "
                     f"{ch['foreign_cores']:>5.2f} / {gs['foreign_cores']:<5.2f}")
    lines += ["", "latency added by the server, model emitting one token every 10 ms (ms, p50; model = its own "
              "time to the first token)",
              f"{'endpoint':>16} | {'TTFT added':>10} {'way in':>6} {'model':>6} {'TTFT-10':>7} | {'ITL-10':>6} "
              f"{'TTFT added':>10} | {'delivery c=1':>12} {'c=16':>5} {'p90':>5}",
              f"{'':>16} | {'c=1':>10} {'':>6} {'':>6} {'':>7} | {'c=16':>6} {'c=16':>10} |"]
    for kind, r in summary["latency"].items():
        if r["ttft_added_p50_ms_c1"] is None:
            continue
        lines.append(f"{kind:>16} | {_ms(r['ttft_added_p50_ms_c1'], 10)} {_ms(r['way_in_p50_ms_c1'], 6)} "
                     f"{_ms(r['model_own_p50_ms_c1'], 6, 2)} {_ms(r['ttft_minus_10_p50_ms_c1'], 7)} | "
                     f"{_ms(r['itl_added_p50_ms_c16'], 6)} {_ms(r['ttft_added_p50_ms_c16'], 10)} | "
                     f"{_ms(r['delivery_p50_ms_c1'], 12)} {_ms(r['delivery_p50_ms_c16'], 5, 2)} "
                     f"{_ms(r['delivery_p90_ms_c16'], 5, 2)}")
    for key, what in (("raw_client_c1", "a new TCP connection per request"),
                      ("raw_kept_c1", "one kept connection, as the OpenAI SDK and AIPerf keep theirs")):
        lines += ["", f"first token at c=1 with a bare asyncio client, {what} (ms, p50): TCP connect + way in "
                  "(request written -> model's execute()) + way out (model's send -> client)"]
        for kind, r in summary[key].items():
            if None in r.values():
                continue
            lines.append(f"{kind:>16} | {r['connect_p50_ms']:.3f} + {r['way_in_p50_ms']:.3f} + "
                         f"{r['way_out_p50_ms']:.3f} = {r['ttft_added_p50_ms']:.3f}")
    lines += ["", "targets (issue 37 item 8):"]
    verdicts = {None: "n/a ", True: "met ", False: "MISS"}
    lines += [f"  {verdicts[ok]}  {name}" for name, ok in summary["targets"].items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main

async def measure(server: Server, args: argparse.Namespace) -> dict:
    results: dict[str, Any] = {"throughput": [], "latency": [], "raw": []}
    for rnd in range(args.rounds):
        for conc in [] if args.ttft_only else args.conc:
            kinds = KINDS if (rnd + conc) % 2 == 0 else KINDS[::-1]
            for kind in kinds:
                point = await run_point(Target(kind, server, "llm_fast", args.tokens), conc, args.duration,
                                        False, server)
                point["round"] = rnd
                results["throughput"].append(point)
                print(f"  round {rnd} c={conc:<3} {kind:<16} {point['tokens_per_s']:>9,.0f} tok/s "
                      f"{point['server_cpu_us_per_token']:6.1f} us/tok, others {point['foreign_cores']:.2f} cores",
                      file=sys.stderr)
        for kind in LATENCY_KINDS if rnd % 2 == 0 else LATENCY_KINDS[::-1]:
            points = ((1, args.latency_requests),) if args.ttft_only else ((1, args.latency_requests), (16, None))
            for conc, requests in points:
                point = await run_point(Target(kind, server, "llm_10ms", args.latency_tokens), conc,
                                        args.duration, True, server, max_requests=requests)
                point["round"] = rnd
                results["latency"].append(point)
                print(f"  round {rnd} c={conc:<3} {kind:<16} 10 ms model: TTFT {point['ttft_p50_ms']:.3f} ms "
                      f"(added {point['ttft_added_p50_ms']:.3f}), ITL {point['itl_p50_ms']:.3f} ms, "
                      f"delivery {point['delivery_p50_ms']:.3f} ms", file=sys.stderr)
            for kept in (False, True):
                point = await raw_point(server, kind, args.latency_requests, kept)
                point["round"] = rnd
                results["raw"].append(point)
                print(f"  round {rnd} c=1   {kind:<16} bare client, {'kept' if kept else 'new '} connection: connect "
                      f"{point['connect_p50_ms']:.3f} + way in {point['way_in_p50_ms']:.3f} + way out "
                      f"{point['way_out_p50_ms']:.3f} ms", file=sys.stderr)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-d", "--duration", type=float, default=8.0, help="seconds per point")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=256, help="tokens per request (throughput)")
    ap.add_argument("--latency-tokens", type=int, default=50, help="tokens per request (10 ms model)")
    ap.add_argument("--latency-requests", type=int, default=40, help="requests at c=1 (10 ms model)")
    ap.add_argument("--ttft-only", action="store_true",
                    help="only the time to first token at c=1 (10 ms model: aiohttp, bare new and kept connections)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (repository, server log)")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    scratch = Path(tempfile.mkdtemp(prefix="openai-stream-"))
    load = loadavg()
    server = Server(build_repo(scratch), scratch)
    try:
        server.wait_ready()
        results = asyncio.run(measure(server, args))
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    results["args"] = vars(args)
    results["summary"] = summarize(results)
    results["meta"] = {"commit": git_commit(), "machine": machine(), "loadavg_before": load,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        print(table(results["summary"]))
        print(f"\ncommit {results['meta']['commit']}, load before {load}, {results['meta']['machine']['cpu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
