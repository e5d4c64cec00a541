"""The one frozen server configuration, built once from the command line.

Flag names and defaults follow tritonserver's; inferd-only knobs (worker timings, run dir) are
grouped at the end. Nothing below this module reads the environment or argv.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from . import rundir
from .cache import parse_cache_config


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected a boolean, got %r" % text)


@dataclass(frozen=True)
class WorkerTimings:
    heartbeat_interval_s: float = 0.5
    heartbeat_misses: int = 4  # a worker silent for interval x misses is hung: killed and restarted
    spawn_timeout_s: float = 30.0  # process start to Hello
    load_timeout_s: float = 300.0  # LoadModel to LoadResult (initialize())
    autocomplete_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0  # Shutdown to exit, then SIGKILL
    restart_base_s: float = 0.25
    restart_cap_s: float = 10.0
    restart_give_up: int = 5  # failures in a row before the model stays UNAVAILABLE
    healthy_run_s: float = 10.0  # a worker that lived this long after ready restarts at once
    pipeline_depth: int = 8  # batches sent ahead to one worker (hides the round trip; executed in order)


@dataclass(frozen=True)
class ServerConfig:
    model_repositories: tuple[str, ...]
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    disable_auto_complete_config: bool = False
    server_id: str = "triton"
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_server: str = "native"  # our HTTP/2 server; "grpcio" = grpc.aio's
    # largest gRPC request message; 0 = the HTTP body cap plus 1 MiB (a tensor of that size fits)
    grpc_max_message_size: int = 0
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_client_shm: bool = False
    log_verbose: int = 0
    response_cache_bytes: int | None = None  # --cache-config local,size=N; None: no response cache
    # inferd-only
    run_dir: str = ""  # sockets live here; default: a fresh temp dir
    owns_run_dir: bool = False  # the run dir is our temp dir: removed at shutdown
    max_queue_size: int = 4096  # default per-model queue bound when the config sets none
    env_cache_dir: str = ""  # unpacked EXECUTION_ENV_PATH tarballs; default ~/.cache/inferd/envs
    env_cache_max_bytes: int = 20 << 30  # LRU eviction of environments no loaded model uses beyond this
    worker: WorkerTimings = field(default_factory=WorkerTimings)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferd", description="KServe v2 / Triton-compatible inference server")
    p.add_argument("--model-repository", "--model-store", action="append", dest="model_repository",
                   required=True, help="model repository path (repeatable)")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
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
    p.add_argument("--allow-metrics", type=_bool, default=True)
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--allow-client-shm", type=_bool, default=False)
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                   help="response cache, as tritonserver: local,size=<bytes> (repeatable)")
    p.add_argument("--response-cache-byte-size", type=int, default=None,
                   help="deprecated tritonserver spelling of --cache-config local,size=<bytes>")
    p.add_argument("--cache-directory", default="",
                   help="accepted for tritonserver command lines; the local cache is built in")
    p.add_argument("--run-dir", default="",
                   help="directory for worker sockets (default: a temp dir of its own, removed at shutdown)")
    p.add_argument("--max-queue-size", type=int, default=4096)
    p.add_argument("--env-cache-dir", default="",
                   help="where EXECUTION_ENV_PATH tarballs are unpacked (default: ~/.cache/inferd/envs)")
    p.add_argument("--env-cache-max-gb", type=float, default=20.0,
                   help="evict least recently used environments no loaded model uses beyond this size")
    p.add_argument("--heartbeat-interval", type=float, default=0.5, help="seconds between worker heartbeats")
    p.add_argument("--heartbeat-misses", type=int, default=4)
    p.add_argument("--worker-start-timeout", type=float, default=30.0)
    p.add_argument("--restart-base-delay", type=float, default=0.25)
    p.add_argument("--restart-max-delay", type=float, default=10.0)
    return p


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    args = build_parser().parse_args(argv)
    if args.model_control_mode == "explicit" and "*" in args.load_model and len(args.load_model) > 1:
        raise SystemExit("error: --load-model=* must be the only --load-model")
    cache_values = list(args.cache_config)
    if args.response_cache_byte_size and not cache_values:  # 0, its default, means no cache
        cache_values = [f"local,size={args.response_cache_byte_size}"]
    try:
        cache = parse_cache_config(cache_values)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    run_dir = args.run_dir or rundir.create()
    os.makedirs(run_dir, exist_ok=True)
    timings = WorkerTimings(
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_misses=args.heartbeat_misses,
        spawn_timeout_s=args.worker_start_timeout,
        restart_base_s=args.restart_base_delay,
        restart_cap_s=args.restart_max_delay,
    )
    return ServerConfig(
        model_repositories=tuple(os.path.abspath(r) for r in args.model_repository),
        model_control_mode=args.model_control_mode,
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
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_server=args.grpc_server,
        grpc_max_message_size=args.grpc_max_message_size,
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_client_shm=args.allow_client_shm,
        log_verbose=args.log_verbose,
        response_cache_bytes=cache.size_bytes if cache is not None else None,
        run_dir=run_dir,
        owns_run_dir=not args.run_dir,
        max_queue_size=args.max_queue_size,
        env_cache_dir=os.path.abspath(os.path.expanduser(args.env_cache_dir)) if args.env_cache_dir
        else os.path.join(os.path.expanduser("~"), ".cache", "inferd", "envs"),
        env_cache_max_bytes=int(args.env_cache_max_gb * (1 << 30)),
        worker=timings,
    )
