"""The command line (and the few environment variables inferd reads) into the one frozen ServerConfig
(config.py). The only place argv and the environment are read; every flag's value is checked here, all
errors reported at once. The tritonserver flags inferd takes without implementing are triton_flags.py's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace

from . import header_rules, rundir, triton_flags
from .config import (
    DEFAULT_MAX_QUEUE_SIZE,
    DEFAULT_PINNED_POOL_BYTES,
    OPENAI_RESTRICTABLE,
    RESTRICTABLE,
    TEST_ONLY_FAKE_GPUS_ENV,
    GrpcKeepalive,
    OpenAIOptions,
    ServerConfig,
    WorkerTimings,
)
from .core.busy_poll import cpu_quota, default_window_us
from .instances import host_policy, memory_cap, recycle
from .metrics.latency_summary import LatencyMetricsConfig, parse_quantiles
from .repository import agents as repo_agents
from .repository import python_backends
from .repository.cloud import credentials as cloud_credentials
from .repository.cloud import location as cloud_location
from .response_cache import parse_cache_config
from .scheduler import rate_limiter
from .tracing import options as trace_options
from .tracing.options import TraceOptions

MAX_BUSY_POLL_US = 1_000_000
MAX_FRONTEND_PROCESSES = 64


def default_frontend_processes(cpus: int) -> int:
    """--frontend-processes when not given. Below 8 CPUs: 1, the supervisor serves HTTP and gRPC itself (a
    frontend process then only adds a hop: the workers and the core's loop need the few CPUs there are).
    From 8: CPUs/4, at most 8. A saturated frontend process keeps about one CPU busy, the core's loop
    (schedulers, the link to every frontend) one more, and the rest is left to the model workers; beyond
    8 frontends the core's single loop, which still handles every request, is the limit, not parsing."""
    if cpus < 8:
        return 1
    return max(1, min(8, cpus // 4))


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected a boolean, got %r" % text)


def _int_or_bool(text: str) -> int:
    """tritonserver's reading of --log-verbose: true is 1, false 0, else an integer."""
    value = text.strip().lower()
    return 1 if value == "true" else 0 if value == "false" else int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferd", description="KServe v2 / Triton-compatible inference server")
    p.add_argument("--model-repository", "--model-store", action="append", dest="model_repository",
                   required=True, help="model repository path (repeatable)")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none",
                   type=str.lower, help="none, poll or explicit (any case, as tritonserver reads it)")
    p.add_argument("--model-namespacing", type=_bool, default=False,
                   help="each model repository is a namespace: one model name may be in several repositories, an "
                        "ensemble's steps resolve in its own first; a name of several models is refused")
    p.add_argument("--load-model", action="append", default=[], help="model to load at start (explicit mode); * = all")
    p.add_argument("--repository-poll-secs", type=float, default=15.0)
    p.add_argument("--strict-readiness", type=_bool, default=True)
    p.add_argument("--exit-on-error", type=_bool, default=True)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--strict-model-config", type=_bool, default=False, help="deprecated alias")
    p.add_argument("--id", dest="server_id", default="triton")
    p.add_argument("--allow-http", type=_bool, default=True)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024)
    p.add_argument("--http-max-connections", type=int, default=8192,
                   help="open HTTP connections beyond this are answered 503 and closed (0: no limit)")
    p.add_argument("--http-max-pipelined-requests", type=int, default=32,
                   help="requests pipelined on one HTTP connection beyond this many waiting are answered 503")
    p.add_argument("--allow-grpc", type=_bool, default=True)
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument(
        "--grpc-max-message-size", type=int, default=0,
        help="largest gRPC message in bytes (default: --http-max-input-size + 1 MiB; Triton allows 2 GiB)",
    )
    p.add_argument(
        "--grpc-server", choices=("native", "grpcio"), default="native",
        help="gRPC implementation: inferd's own HTTP/2 server (fast) or grpcio's grpc.aio server",
    )
    p.add_argument("--reuse-http-port", type=_bool, default=False,
                   help="let several servers listen on the HTTP port (each must set it)")
    p.add_argument("--reuse-grpc-port", type=_bool, default=False,
                   help="let several servers listen on the gRPC port (each must set it)")
    p.add_argument("--grpc-use-ssl", type=_bool, default=False, help="serve gRPC over TLS")
    p.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False,
                   help="serve gRPC over TLS and require client certificates signed by --grpc-root-cert")
    p.add_argument("--grpc-server-cert", default="", help="PEM file of the server certificate (chain)")
    p.add_argument("--grpc-server-key", default="", help="PEM file of the server's private key")
    p.add_argument("--grpc-root-cert", default="", help="PEM file of the CA that signs client certificates")
    keepalive = GrpcKeepalive()
    for flag, default, kind in (
        ("--grpc-keepalive-time", keepalive.time_ms, int),
        ("--grpc-keepalive-timeout", keepalive.timeout_ms, int),
        ("--grpc-keepalive-permit-without-calls", keepalive.permit_without_calls, _bool),
        ("--grpc-http2-max-pings-without-data", keepalive.max_pings_without_data, int),
        ("--grpc-http2-min-recv-ping-interval-without-data", keepalive.min_recv_ping_interval_without_data_ms, int),
        ("--grpc-http2-max-ping-strikes", keepalive.max_ping_strikes, int),
        ("--grpc-max-connection-age", keepalive.max_connection_age_ms, int),
        ("--grpc-max-connection-age-grace", keepalive.max_connection_age_grace_ms, int),
    ):
        # None: not given (only the grpcio server caps its PINGs, so the start-up log says so when it is)
        p.add_argument(flag, type=kind, default=None if flag == "--grpc-http2-max-pings-without-data" else default,
                       help="as tritonserver's (the native server applies all but --grpc-http2-max-pings-without-data)")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
                   help="answer these API categories only when header KEY is VALUE (repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="PROTOCOLS:KEY=VALUE",
                   help="answer these gRPC categories only when metadata KEY is VALUE (repeatable)")
    p.add_argument("--http-header-forward-pattern", default="",
                   help="regular expression: matching HTTP headers become inference request parameters")
    p.add_argument("--grpc-header-forward-pattern", default="",
                   help="regular expression: matching gRPC metadata become inference request parameters")
    p.add_argument("--allow-metrics", type=_bool, default=True)
    p.add_argument("--allow-cpu-metrics", type=_bool, default=True)
    p.add_argument("--allow-gpu-metrics", type=_bool, default=True,
                   help="export nv_gpu_* metrics read from NVML (where NVML works)")
    p.add_argument("--metrics-interval-ms", type=float, default=2000.0,
                   help="how often the GPU metrics are read (the other gauges are read when scraped)")
    p.add_argument("--metrics-address", default=None, help="default: --http-address, as tritonserver")
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="summary_latencies=true (latency summaries), counter_latencies=false (no *_duration_us "
                        "counters), summary_quantiles=<q>:<error>,...; repeatable")
    p.add_argument("--allow-client-shm", type=_bool, default=False)
    p.add_argument("--model-config-name", default=None,
                   help="load <model>/configs/<NAME>.pbtxt where a model has it, else its config.pbtxt")
    p.add_argument("--model-load-retry-count", type=int, default=0, help="times a failed model load is retried")
    p.add_argument("--model-load-thread-count", type=int, default=4,
                   help="how many models start their workers at once (tritonserver's load threads)")
    p.add_argument("--host-policy", action="append", default=[], metavar="NAME,SETTING=VALUE",
                   help="cpu-cores=<first>-<last>[,...] or numa-node=<n>: the CPUs of the workers of instances "
                        "whose policy is NAME (their group's host_policy, else cpu, gpu_<n> or model); repeatable")
    p.add_argument("--backend-directory", default=python_backends.DEFAULT_DIRECTORY,
                   help="where Python-based backends live: a model whose config says backend \"<name>\" (a backend "
                        "inferd does not have itself) runs <this directory>/<name>/model.py (python_backend's "
                        "'Python-based Backends'); inferd's own backends are built in")
    p.add_argument("--repoagent-directory", default=repo_agents.DEFAULT_DIRECTORY,
                   help="where Triton keeps repository agent libraries; inferd's agents (checksum) are built in, "
                        "and a model naming another agent fails to load, naming this directory")
    p.add_argument("--log-verbose", type=_int_or_bool, default=0, help="verbose level (true: 1, false: 0)")
    p.add_argument("--log-file", default="", help="write the log (the workers' output too) to this file")
    p.add_argument("--log-format", choices=("default", "ISO8601", "json"), default="default",
                   help="default and ISO8601 as tritonserver; json: one JSON object per line")
    p.add_argument("--log-info", type=_bool, default=True)
    p.add_argument("--log-warning", type=_bool, default=True)
    p.add_argument("--log-error", type=_bool, default=True)
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="request tracing, as tritonserver: rate=, level=, count=, mode=triton|opentelemetry, "
                        "triton,file=, triton,log-frequency=, opentelemetry,url=, opentelemetry,resource=K=V "
                        "(repeatable)")
    for flag in ("--trace-file", "--trace-level", "--trace-rate", "--trace-count", "--trace-log-frequency"):
        p.add_argument(flag, action="append", default=[], help="deprecated tritonserver spelling of --trace-config")
    p.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                   help="response cache, as tritonserver: local,size=<bytes> (repeatable)")
    p.add_argument("--response-cache-byte-size", type=int, default=None,
                   help="deprecated tritonserver spelling of --cache-config local,size=<bytes>")
    p.add_argument("--rate-limit", default="off", metavar="MODE",
                   help="execution_count: an instance whose group has a rate_limiter runs only once it holds its "
                        "resources, turns going by executions x priority; off (default): no rate limiting")
    p.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                   help="copies of a rate-limiter resource (on DEVICE, else on every device; a global resource "
                        "takes the largest count given); default: the largest count any loaded instance asks")
    p.add_argument("--run-dir", default="",
                   help="directory for worker sockets (default: a temp dir of its own, removed at shutdown)")
    p.add_argument("--max-queue-size", type=int, default=DEFAULT_MAX_QUEUE_SIZE)
    p.add_argument("--busy-poll-us", type=int, default=None,
                   help="at concurrency 1 the event loop polls instead of sleeping for this many µs after each "
                        "request, while a CPU is free (default 1000 with 2 or more CPUs and no CPU quota, else "
                        "0: off; raise it above the models' execute time to poll through them)")
    p.add_argument("--frontend-processes", type=int, default=None,
                   help="processes that accept HTTP and gRPC (SO_REUSEPORT) and hand requests to the supervisor "
                        "(default: 1 below 8 CPUs, else CPUs/4 up to 8; 1: the supervisor serves them itself)")
    p.add_argument("--frontend-direct", type=_bool, default=True,
                   help="with frontend processes, they send the requests of simple models straight to the model's "
                        "workers (default true; false: every request passes through the supervisor)")
    p.add_argument("--env-cache-dir", default="",
                   help="where EXECUTION_ENV_PATH tarballs are unpacked (default: ~/.cache/inferd/envs)")
    p.add_argument("--env-cache-max-gb", type=float, default=20.0,
                   help="evict least recently used environments no loaded model uses beyond this size")
    p.add_argument("--env-unpack-max-gb", type=float, default=16.0,
                   help="refuse an environment tarball larger than this or whose files add up to more")
    p.add_argument("--env-unpack-max-files", type=int, default=500_000,
                   help="refuse an environment tarball with more members than this")
    p.add_argument("--cloud-cache-dir", default="",
                   help="where models of cloud repositories are copied (default: ~/.cache/inferd/models)")
    p.add_argument("--cloud-timeout-secs", type=float, default=60.0,
                   help="connect and read timeout of each request to a cloud repository")
    p.add_argument("--heartbeat-interval", type=float, default=0.5, help="seconds between worker heartbeats")
    p.add_argument("--heartbeat-misses", type=int, default=4)
    p.add_argument("--worker-start-timeout", type=float, default=30.0)
    p.add_argument("--restart-base-delay", type=float, default=0.25)
    p.add_argument("--restart-max-delay", type=float, default=10.0)
    p.add_argument("--instance-memory-limit", default="", metavar="SIZE",
                   help="memory cap of each model instance's worker (bytes, or with K, M or G: 512M; default: none); "
                        "a model's INFERD_INSTANCE_MEMORY_LIMIT parameter overrides it (docs/reliability.md)")
    p.add_argument("--instance-max-requests", default="", metavar="N",
                   help="replace an instance's worker by a fresh one after about N requests, without a gap (default: "
                        "never); a model's INFERD_MAX_REQUESTS parameter overrides it (docs/reliability.md)")
    p.add_argument("--instance-max-age", default="", metavar="AGE",
                   help="replace an instance's worker after about this long (seconds, or 90s, 30m, 12h; default: "
                        "never); a model's INFERD_MAX_AGE parameter overrides it")
    p.add_argument("--host-fd", type=int, default=-1,
                   help="inherited Unix socket to the process that hosts the 'external' backend's models (the "
                        "Python API, inferd.pytriton); its EOF shuts the server down")
    _add_openai(p)
    triton_flags.add_to(p)
    return p


def _add_openai(p: argparse.ArgumentParser) -> None:
    """The flags of Triton's OpenAI frontend (python/openai), served by this process (openai_api/)."""
    g = p.add_argument_group("OpenAI-compatible API (docs/openai.md)")
    g.add_argument("--openai-port", type=int, default=0,
                   help="serve the OpenAI API on this port (Triton's frontend uses 9000; 0: off)")
    g.add_argument("--openai-address", default="0.0.0.0")
    g.add_argument("--tokenizer", default="",
                   help="local directory (or tokenizer.json) of the tokenizer for chat templates and token counts; "
                        "a model's config parameter 'tokenizer' overrides it. Nothing is downloaded")
    g.add_argument("--openai-backend", choices=("vllm", "tensorrtllm"), default=None,
                   help="the input convention for every model (Triton's --backend); default: vllm for models of "
                        "backend 'vllm', TensorRT-LLM style tensors for the others")
    g.add_argument("--lora-separator", default="",
                   help="a LoRA adapter may follow the model name after this separator (model<sep>lora)")
    g.add_argument("--tool-call-parser", choices=("llama3", "mistral"), default=None,
                   help="how tool calls are read from the model's text (needed for tools with tool_choice auto)")
    g.add_argument("--max-tool-call-parse-bytes", type=int, default=128 * 1024,
                   help="a streamed automatic tool call longer than this ends with finish_reason 'length'")
    g.add_argument("--chat-template", default="",
                   help="a Jinja chat template file used instead of the tokenizers' own")
    g.add_argument("--default-max-tokens", type=int, default=16,
                   help="max_tokens of a request that sets none")
    g.add_argument("--openai-restricted-api", action="append", nargs="+", default=[],
                   metavar="APIS KEY VALUE",
                   help="'<api>[,<api>...] <header> <value>' (one argument or three): these API groups (inference, "
                        "embedding, model-repository, metrics, health) answer only requests carrying the header "
                        "with that value; repeatable")


def parse_openai_restrictions(values: list[list[str]]) -> dict[str, tuple[str, str]]:
    """--openai-restricted-api values, each '<apis> <key> <value>' as one argument or three, as Triton's
    OpenAI frontend reads them; ValueError with its messages."""
    restricted: dict[str, tuple[str, str]] = {}
    for given in values:
        parts = given[0].split() if len(given) == 1 else list(given)
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"--openai-restricted-api {' '.join(given)!r}: expected '<apis> <header> <value>'")
        apis, key, value = parts
        for api in apis.split(","):
            if api not in OPENAI_RESTRICTABLE:
                raise ValueError(f"--openai-restricted-api: Unknown API '{api}'. "
                                 f"Available APIs: {list(OPENAI_RESTRICTABLE)}")
            if api in restricted:
                raise ValueError(f"--openai-restricted-api: restricted api '{api}' can not be specified in "
                                 "multiple config groups")
            restricted[api] = (key, value)
    return restricted


def _openai_errors(args: argparse.Namespace) -> list[str]:
    errors = []
    if not 0 <= args.openai_port <= 65535:
        errors.append("--openai-port must be between 0 and 65535")
    if args.tokenizer and not os.path.exists(args.tokenizer):
        errors.append(f"--tokenizer {args.tokenizer}: no such file or directory (inferd reads tokenizers from local "
                      "files only: download it first, e.g. `hf download <id> --include '*.json' --local-dir DIR`)")
    if args.chat_template and not os.path.isfile(args.chat_template):
        errors.append(f"--chat-template {args.chat_template}: no such file")
    if args.default_max_tokens < 0:
        errors.append("--default-max-tokens must not be negative")
    if args.max_tool_call_parse_bytes <= 0:
        errors.append("--max-tool-call-parse-bytes must be greater than 0")
    return errors


def parse_restrictions(values: list[str], flag: str, categories: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """`<cat>[,<cat>...]:<key>=<value>` (repeatable) as {category: (key, value)}. ValueError naming what
    is wrong."""
    restricted: dict[str, tuple[str, str]] = {}
    for text in values:
        cats, sep, rule = text.partition(":")
        key, eq, value = rule.partition("=")
        if not sep or not eq or not cats.strip() or not key.strip():
            raise ValueError(f"{flag}={text}: expected <categories>:<key>=<value>")
        for cat in (c.strip() for c in cats.split(",")):
            if cat not in categories:
                raise ValueError(f"{flag}={text}: unknown category '{cat}' (known: {', '.join(categories)})")
            if cat in restricted:
                raise ValueError(f"{flag}: category '{cat}' is restricted more than once")
            restricted[cat] = (key.strip(), value)  # matched in any case; named as typed in refusals
    return restricted


def parse_metrics_config(values: list[str]) -> tuple[LatencyMetricsConfig, list[str]]:
    """--metrics-config SETTING=VALUE values (the last of a setting wins) -> the config and start-up log lines
    for the settings that change nothing. Raises ValueError for a value inferd cannot read. Like tritonserver
    2.51, an unknown setting or an odd boolean does not stop the start (inferd names it in the log); a
    summary_quantiles value that is not <quantile>:<error>,... does."""
    cfg = LatencyMetricsConfig()
    notes: list[str] = []
    for item in values:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--metrics-config {item}: expected <setting>=<value>")
        if key in ("summary_latencies", "counter_latencies", "histogram_latencies"):
            # as tritonserver 2.51 reads them: only "true" turns a setting on (TRUE, 1, yes leave it
            # off) and only "false" turns counter_latencies off; no value stops the start
            if value not in ("true", "false"):
                notes.append(f"--metrics-config {item}: read as tritonserver reads it, "
                             f"{'off' if key != 'counter_latencies' else 'on'} (only true and false are meant)")
            if key == "summary_latencies":
                cfg = replace(cfg, summaries=value == "true")
            elif key == "counter_latencies":
                cfg = replace(cfg, counters=value != "false")
            else:  # nv_inference_first_response_histogram_ms (Triton 2.52 and later)
                cfg = replace(cfg, histograms=value == "true")
        elif key == "summary_quantiles":
            cfg = replace(cfg, quantiles=parse_quantiles(value))
        else:
            notes.append(f"--metrics-config {item}: unknown setting, ignored (as tritonserver does)")
    return cfg, notes


def _pinned_pool_bytes(values: list[str] | None) -> int:
    """--pinned-memory-pool-byte-size (the last one given; its format is checked with the other tritonserver
    flags): the total inferd reports as nv_pinned_memory_pool_total_bytes, as Triton does without a GPU."""
    if not values:
        return DEFAULT_PINNED_POOL_BYTES
    try:
        return max(0, int(values[-1].strip()))
    except ValueError:
        return DEFAULT_PINNED_POOL_BYTES  # (refused as a flag error, naming the flag)


def _trace_notes(trace: TraceOptions) -> list[str]:
    if trace.mode == "triton" and trace.level != ("OFF",) and not trace.file:
        # tritonserver 2.51 starts so too, and writes nothing
        return [f"--trace-config level={trace.level[0]} without a trace file (--trace-config triton,file=<path>): "
                "no traces are written"]
    return []


def _grpc_notes(args: argparse.Namespace) -> list[str]:
    if args.grpc_http2_max_pings_without_data is not None and args.grpc_server == "native":
        return [f"--grpc-http2-max-pings-without-data={args.grpc_http2_max_pings_without_data} has no effect in "
                "inferd: the native gRPC server does not cap its keepalive PINGs (--grpc-server grpcio does)"]
    return []


def _flag_errors(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the flags, a line each (all of them at once, not the first only)."""
    errors = triton_flags.refusals(args)
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        needed = ["--grpc-server-cert", "--grpc-server-key"]
        if args.grpc_use_ssl_mutual:
            needed.append("--grpc-root-cert")
        for flag in needed:
            path = getattr(args, flag.lstrip("-").replace("-", "_"))
            if not path:
                errors.append(f"{flag} is required to serve gRPC over TLS")
            elif not os.path.isfile(path):
                errors.append(f"{flag} {path}: no such file")
    for flag, pattern in (("--http-header-forward-pattern", args.http_header_forward_pattern),
                          ("--grpc-header-forward-pattern", args.grpc_header_forward_pattern)):
        try:
            header_rules.forward_pattern(pattern)
        except re.error as exc:
            errors.append(f"{flag}: not a regular expression: {exc}")
    name = args.model_config_name
    if name == "":
        errors.append("--model-config-name: empty argument")
    if name and (len(name) > 255 or name in (".", "..") or any(c.isspace() or c in "/\\" for c in name)):
        errors.append(f"--model-config-name {name!r}: must be a file name (no spaces or slashes)")
    for repo in args.model_repository:
        if cloud_location.is_cloud_url(repo):  # s3://, gs://, as://: copied from the cloud (repository/cloud)
            try:
                scheme = cloud_location.parse_url(repo).scheme
            except ValueError as exc:
                errors.append(f"--model-repository {exc}")
                continue
            module, package = cloud_location.LIBRARIES[scheme]
            if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
                errors.append(f"--model-repository {repo}: needs the {package} package "
                              "(pip install 'inferd[cloud]')")
    if not args.cloud_timeout_secs > 0:
        errors.append("--cloud-timeout-secs must be greater than 0")
    if args.model_control_mode == "poll" and not args.repository_poll_secs > 0:
        errors.append("--repository-poll-secs must be greater than 0 with --model-control-mode poll")
    if args.load_model and args.model_control_mode != "explicit":
        errors.append("--load-model requires --model-control-mode=explicit (tritonserver refuses it in "
                      f"{args.model_control_mode} mode)")
    if args.http_max_input_size <= 0:
        errors.append("--http-max-input-size must be greater than 0")
    if args.response_cache_byte_size is not None and args.cache_config:
        errors.append("--response-cache-byte-size and --cache-config both given: give one or the other "
                      "(as tritonserver)")
    if args.model_load_thread_count < 1:
        errors.append("--model-load-thread-count must be at least 1")
    try:
        host_policy.parse(args.host_policy)
    except ValueError as exc:
        errors.append(str(exc))
    if environ.get("AIP_MODE", "") == "PREDICTION" and not args.triton_allow_vertex_ai:
        errors.append("AIP_MODE=PREDICTION: tritonserver serves Vertex AI then (--allow-vertex-ai defaults to true, "
                      "HTTP and gRPC to false), which inferd does not have: give --allow-vertex-ai=false")
    if args.model_load_retry_count < 0:
        errors.append("--model-load-retry-count must not be negative")
    if not args.metrics_interval_ms > 0:
        errors.append("--metrics-interval-ms must be greater than 0")
    if not args.env_unpack_max_gb > 0 or args.env_unpack_max_files < 1:
        errors.append("--env-unpack-max-gb and --env-unpack-max-files must be greater than 0")
    fake = environ.get(TEST_ONLY_FAKE_GPUS_ENV, "").strip()
    if fake and not (fake.isdigit() or fake.lower() == "error"):
        errors.append(f"{TEST_ONLY_FAKE_GPUS_ENV}={fake}: expected a number of GPUs or 'error' (tests only)")
    if args.http_max_connections < 0:
        errors.append("--http-max-connections must not be negative (0: no limit)")
    if args.http_max_pipelined_requests < 1:
        errors.append("--http-max-pipelined-requests must be at least 1")
    if args.frontend_processes is not None and not 1 <= args.frontend_processes <= MAX_FRONTEND_PROCESSES:
        errors.append(f"--frontend-processes must be between 1 and {MAX_FRONTEND_PROCESSES}")
    if args.model_namespacing and (args.frontend_processes or 1) > 1:
        errors.append("--model-namespacing=true: frontend processes cannot serve namespaced models yet; "
                      "use --frontend-processes 1 (the default with namespacing)")
    if args.busy_poll_us is not None and not 0 <= args.busy_poll_us <= MAX_BUSY_POLL_US:
        errors.append(f"--busy-poll-us must be between 0 and {MAX_BUSY_POLL_US} (1 s)")
    errors += _openai_errors(args)
    if args.rate_limit.strip().lower() not in rate_limiter.MODES:
        errors.append(f"--rate-limit={args.rate_limit}: invalid argument for --rate-limit (execution_count or off)")
    for text in args.rate_limit_resource:
        try:
            rate_limiter.parse_resource_flag(text)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The configuration from the command line and the few environment variables inferd reads
    (`environ`, default os.environ: the only place the environment is read)."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    if args.model_control_mode == "explicit" and "*" in args.load_model and len(args.load_model) > 1:
        raise SystemExit("error: --load-model=* must be the only --load-model")
    errors = _flag_errors(args, env)
    creds = None
    if any(cloud_location.is_cloud_url(r) for r in args.model_repository):
        try:
            creds = cloud_credentials.CloudCredentials.from_environ(env)
        except ValueError as exc:
            errors.append(str(exc))
    http_restricted: dict[str, tuple[str, str]] = {}
    grpc_restricted: dict[str, tuple[str, str]] = {}
    try:
        http_restricted = parse_restrictions(args.http_restricted_api, "--http-restricted-api", RESTRICTABLE)
        grpc_restricted = parse_restrictions(args.grpc_restricted_protocol, "--grpc-restricted-protocol",
                                             RESTRICTABLE)
    except ValueError as exc:
        errors.append(str(exc))
    openai_restricted: dict[str, tuple[str, str]] = {}
    try:
        openai_restricted = parse_openai_restrictions(args.openai_restricted_api)
    except ValueError as exc:
        errors.append(str(exc))
    metrics_latency, metrics_notes = LatencyMetricsConfig(), list[str]()
    try:
        metrics_latency, metrics_notes = parse_metrics_config(args.metrics_config)
    except ValueError as exc:
        errors.append(str(exc) if str(exc).startswith("--metrics-config") else f"--metrics-config {exc}")
    trace = TraceOptions()
    try:
        trace = trace_options.parse(args.trace_config, args.trace_file, args.trace_level, args.trace_rate,
                                    args.trace_count, args.trace_log_frequency)
    except ValueError as exc:
        errors.append(str(exc) if str(exc).startswith("--") else f"--trace-config (or --trace-level): {exc}")
    if errors:
        raise SystemExit("error: " + "\nerror: ".join(errors))
    cache_values = list(args.cache_config)
    if args.response_cache_byte_size and not cache_values:  # 0, its default, means no cache
        cache_values = [f"local,size={args.response_cache_byte_size}"]
    try:
        cache = parse_cache_config(cache_values)
    except ValueError as exc:
        raise SystemExit(f"error: --cache-config: {exc}") from None
    run_dir = args.run_dir or rundir.create()
    os.makedirs(run_dir, exist_ok=True)
    try:
        memory_limit = memory_cap.parse_size(args.instance_memory_limit)
    except ValueError as exc:
        raise SystemExit(f"error: --instance-memory-limit: {exc}") from None
    try:
        max_requests = recycle.parse_requests(args.instance_max_requests)
    except ValueError as exc:
        raise SystemExit(f"error: --instance-max-requests: {exc}") from None
    try:
        max_age = recycle.parse_age(args.instance_max_age)
    except ValueError as exc:
        raise SystemExit(f"error: --instance-max-age: {exc}") from None
    timings = WorkerTimings(
        memory_limit_bytes=memory_limit,
        max_requests=max_requests,
        max_age_s=max_age,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_misses=args.heartbeat_misses,
        spawn_timeout_s=args.worker_start_timeout,
        restart_base_s=args.restart_base_delay,
        restart_cap_s=args.restart_max_delay,
    )
    return ServerConfig(
        model_repositories=tuple(r.rstrip("/") if cloud_location.is_cloud_url(r) else os.path.abspath(r)
                                 for r in args.model_repository),
        model_control_mode=args.model_control_mode,
        model_namespacing=args.model_namespacing,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        disable_auto_complete_config=args.disable_auto_complete_config or args.strict_model_config,
        server_id=args.server_id,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        http_max_connections=args.http_max_connections,
        http_max_pipelined_requests=args.http_max_pipelined_requests,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_server=args.grpc_server,
        grpc_max_message_size=args.grpc_max_message_size,
        reuse_http_port=args.reuse_http_port,
        reuse_grpc_port=args.reuse_grpc_port,
        grpc_use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=os.path.abspath(args.grpc_server_cert) if args.grpc_server_cert else "",
        grpc_server_key=os.path.abspath(args.grpc_server_key) if args.grpc_server_key else "",
        grpc_root_cert=os.path.abspath(args.grpc_root_cert) if args.grpc_root_cert else "",
        grpc_keepalive=GrpcKeepalive(
            time_ms=args.grpc_keepalive_time,
            timeout_ms=args.grpc_keepalive_timeout,
            permit_without_calls=args.grpc_keepalive_permit_without_calls,
            max_pings_without_data=(GrpcKeepalive().max_pings_without_data if args.grpc_http2_max_pings_without_data
                                    is None else args.grpc_http2_max_pings_without_data),
            min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
            max_ping_strikes=args.grpc_http2_max_ping_strikes,
            max_connection_age_ms=args.grpc_max_connection_age,
            max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        ),
        http_restricted=http_restricted,
        grpc_restricted=grpc_restricted,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        allow_metrics=args.allow_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_address=args.http_address if args.metrics_address is None else args.metrics_address,
        metrics_port=args.metrics_port,
        metrics_latency=metrics_latency,
        pinned_memory_pool_bytes=_pinned_pool_bytes(args.triton_pinned_memory_pool_byte_size),
        allow_client_shm=args.allow_client_shm,
        model_config_name=args.model_config_name or "",
        model_load_retry_count=args.model_load_retry_count,
        repoagent_directory=args.repoagent_directory,
        backend_directory=os.path.abspath(args.backend_directory),
        model_load_thread_count=args.model_load_thread_count,
        host_policies=host_policy.parse(args.host_policy),
        log_verbose=args.log_verbose,
        log_file=os.path.abspath(args.log_file) if args.log_file else "",
        log_format=args.log_format,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        inert_flags=(tuple(triton_flags.inert_given(args)) + tuple(metrics_notes) + tuple(_trace_notes(trace))
                     + tuple(_grpc_notes(args))),
        response_cache_bytes=cache.size_bytes if cache is not None else None,
        trace=replace(trace, file=os.path.abspath(trace.file)) if trace.file else trace,
        rate_limit=args.rate_limit.strip().lower(),
        rate_limit_resources=tuple((r.name, r.count, r.device) for r in
                                   map(rate_limiter.parse_resource_flag, args.rate_limit_resource)),
        run_dir=run_dir,
        owns_run_dir=not args.run_dir,
        host_fd=args.host_fd,
        max_queue_size=args.max_queue_size,
        busy_poll_us=(args.busy_poll_us if args.busy_poll_us is not None
                      else default_window_us(len(os.sched_getaffinity(0)), cpu_quota())),
        frontend_processes=(args.frontend_processes if args.frontend_processes is not None else 1
                            if args.model_namespacing else default_frontend_processes(len(os.sched_getaffinity(0)))),
        frontend_processes_given=args.frontend_processes is not None,
        frontend_direct=args.frontend_direct,
        argv=tuple(sys.argv[1:] if argv is None else argv),
        env_cache_dir=os.path.abspath(os.path.expanduser(args.env_cache_dir)) if args.env_cache_dir
        else os.path.join(os.path.expanduser("~"), ".cache", "inferd", "envs"),
        env_cache_max_bytes=int(args.env_cache_max_gb * (1 << 30)),
        env_unpack_max_bytes=int(args.env_unpack_max_gb * (1 << 30)),
        env_unpack_max_members=args.env_unpack_max_files,
        cloud_credentials=creds,
        cloud_cache_dir=os.path.abspath(os.path.expanduser(args.cloud_cache_dir)) if args.cloud_cache_dir
        else os.path.join(os.path.expanduser("~"), ".cache", "inferd", "models"),
        cloud_timeout_secs=args.cloud_timeout_secs,
        worker=timings,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
        test_only_fake_gpus=env.get(TEST_ONLY_FAKE_GPUS_ENV, "").strip(),
        notify_socket=env.get("NOTIFY_SOCKET", ""),
        openai=OpenAIOptions(
            port=args.openai_port,
            address=args.openai_address,
            tokenizer=os.path.abspath(args.tokenizer) if args.tokenizer else "",
            backend=args.openai_backend or "",
            lora_separator=args.lora_separator,
            tool_call_parser=args.tool_call_parser or "",
            chat_template=os.path.abspath(args.chat_template) if args.chat_template else "",
            default_max_tokens=args.default_max_tokens,
            max_tool_call_parse_bytes=args.max_tool_call_parse_bytes,
            restricted=openai_restricted,
        ),
    )
