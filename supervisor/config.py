"""The one frozen server configuration: built once at start (flags.py reads the command line and the
environment into it) and passed down. Flag names and defaults follow tritonserver's; inferd-only knobs
(worker timings, run dir) are grouped at the end. Nothing below flags.py reads the environment or argv.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .metrics.latency_summary import LatencyMetricsConfig
from .repository.cloud import credentials as cloud_credentials
from .tracing.options import TraceOptions

# API categories that --http-restricted-api / --grpc-restricted-protocol name (tritonserver's)
RESTRICTABLE = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                "statistics", "trace", "logging")
# TEST ONLY: made-up GPUs instead of the host's NVML (see ServerConfig.test_only_fake_gpus)
TEST_ONLY_FAKE_GPUS_ENV = "INFERD_TEST_ONLY_FAKE_GPUS"
DEFAULT_PINNED_POOL_BYTES = 268435456  # tritonserver's --pinned-memory-pool-byte-size default


# --max-queue-size's default: a memory guard, not a figure a client sees (with frontend processes on the direct
# path it holds per frontend process; a bound the operator sets keeps the model on the core's one queue)
DEFAULT_MAX_QUEUE_SIZE = 4096

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
    # --instance-memory-limit, or the model's INFERD_INSTANCE_MEMORY_LIMIT (instances/memory_cap.py); None: no cap
    memory_limit_bytes: int | None = None
    # recycling (instances/recycle.py): --instance-max-requests / --instance-max-age, or the model's
    # INFERD_MAX_REQUESTS / INFERD_MAX_AGE; None: never
    max_requests: int | None = None
    max_age_s: float | None = None


@dataclass(frozen=True)
class GrpcKeepalive:
    """tritonserver's --grpc-keepalive-* and --grpc-http2-* settings (milliseconds), Triton's defaults;
    0 for the connection age means no limit."""

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_without_data_ms: int = 300_000
    max_ping_strikes: int = 2
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0


# API groups --openai-restricted-api names (Triton's OpenAI frontend; "embedding" as its README has it)
OPENAI_RESTRICTABLE = ("inference", "embedding", "model-repository", "metrics", "health")


@dataclass(frozen=True)
class OpenAIOptions:
    """The OpenAI-compatible API (--openai-port and the flags of Triton's OpenAI frontend; docs/openai.md)."""

    port: int = 0  # 0: not served
    address: str = "0.0.0.0"
    tokenizer: str = ""  # local directory or tokenizer.json for every model without its own ("" = none)
    backend: str = ""  # "" (per model: vllm for backend "vllm", else TensorRT-LLM style) | vllm | tensorrtllm
    lora_separator: str = ""
    tool_call_parser: str = ""  # "" | llama3 | mistral
    chat_template: str = ""  # a Jinja file that replaces the tokenizers' own chat templates
    default_max_tokens: int = 16
    max_tool_call_parse_bytes: int = 128 * 1024  # a streamed auto tool call longer than this ends ("length")
    # API group -> (header, value), from --openai-restricted-api
    restricted: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerConfig:
    model_repositories: tuple[str, ...]
    model_control_mode: str = "none"  # none | poll | explicit
    model_namespacing: bool = False  # --model-namespacing: a name may be in several repositories (core/namespaces.py)
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
    http_max_connections: int = 8192  # open HTTP connections; beyond: 503 and close (0: no limit)
    http_max_pipelined_requests: int = 32  # waiting behind a running one on a connection; beyond: 503
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_server: str = "native"  # our HTTP/2 server; "grpcio" = grpc.aio's
    # largest gRPC request message; 0 = the HTTP body cap plus 1 MiB (a tensor of that size fits)
    grpc_max_message_size: int = 0
    reuse_http_port: bool = False  # SO_REUSEPORT: several servers share the port
    reuse_grpc_port: bool = False
    # gRPC over TLS: server certificate and key (PEM files); mutual: clients must present a
    # certificate signed by grpc_root_cert
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    grpc_keepalive: GrpcKeepalive = field(default_factory=GrpcKeepalive)
    # API categories that answer only requests carrying a header (--http-restricted-api,
    # --grpc-restricted-protocol): category -> (header key, expected value)
    http_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    # headers whose name matches become string parameters of inference requests ("" = none)
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True  # nv_gpu_* from NVML where it works
    metrics_interval_ms: float = 2000.0  # how often the GPU gauges are read
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    metrics_latency: LatencyMetricsConfig = field(default_factory=LatencyMetricsConfig)  # --metrics-config
    # --pinned-memory-pool-byte-size: only reported (nv_pinned_memory_pool_total_bytes), as Triton without a GPU
    pinned_memory_pool_bytes: int = DEFAULT_PINNED_POOL_BYTES
    allow_client_shm: bool = False
    model_config_name: str = ""  # load <model>/configs/<name>.pbtxt where it exists, else config.pbtxt
    model_load_retry_count: int = 0  # a failed load is tried again this many times
    repoagent_directory: str = "/opt/tritonserver/repoagents"  # where Triton's agent libraries would be
    # --backend-directory: Python-based backends, <dir>/<name>/model.py (repository/python_backends.py)
    backend_directory: str = "/opt/tritonserver/backends"
    model_load_thread_count: int = 4  # models whose workers start at once (Triton's load threads)
    # --host-policy: policy name -> {"cpu-cores" | "numa-node": value} (instances/host_policy.py)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    log_verbose: int = 0
    log_file: str = ""  # "" = standard error
    log_format: str = "default"  # default | ISO8601
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    response_cache_bytes: int | None = None  # --cache-config local,size=N; None: no response cache
    trace: TraceOptions = field(default_factory=TraceOptions)  # --trace-config (and the deprecated --trace-*)
    rate_limit: str = "off"  # --rate-limit: off | execution_count (scheduler/rate_limiter.py)
    # --rate-limit-resource: (name, count, device or None for every device)
    rate_limit_resources: tuple[tuple[str, int, int | None], ...] = ()
    # inferd-only
    run_dir: str = ""  # sockets live here; default: a fresh temp dir
    owns_run_dir: bool = False  # the run dir is our temp dir: removed at shutdown
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE  # default per-model queue bound when the config sets none
    busy_poll_us: int = 0  # the most the event loop polls after a request instead of sleeping, µs (0: off)
    # processes serving HTTP and gRPC (frontend_processes/); 1: the supervisor itself, as always. Default from the CPUs
    frontend_processes: int = 1
    frontend_direct: bool = True  # frontends send simple models' requests straight to the workers (direct_core.py)
    frontend_processes_given: bool = False  # by the flag; else the default, which CUDA shared memory makes 1 (app.py)
    argv: tuple[str, ...] = ()  # the command line this config was parsed from (frontend processes parse it too)
    env_cache_dir: str = ""  # unpacked EXECUTION_ENV_PATH tarballs; default ~/.cache/inferd/envs
    env_cache_max_bytes: int = 20 << 30  # LRU eviction of environments no loaded model uses beyond this
    env_unpack_max_bytes: int = 16 << 30  # one environment's files (and its tarball) may take at most this
    env_unpack_max_members: int = 500_000  # and hold at most this many members
    # cloud repositories (s3://, gs://, as://): their credentials (None when no repository is a URL),
    # where models are copied, and the connect/read timeout of each storage request
    cloud_credentials: cloud_credentials.CloudCredentials | None = None
    cloud_cache_dir: str = ""
    cloud_timeout_secs: float = 60.0
    worker: WorkerTimings = field(default_factory=WorkerTimings)
    # GPU numbering (gpus.py): the server's CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, None when unset
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None
    # TEST ONLY (INFERD_TEST_ONLY_FAKE_GPUS): "<n>" made-up GPUs, or "error" for an NVML that fails to
    # start, instead of the host's NVML; lets CPU-only tests reach GPU placement and GPU metrics
    test_only_fake_gpus: str = ""
    notify_socket: str = ""  # $NOTIFY_SOCKET (systemd Type=notify): READY=1 and STOPPING=1 go there
    host_fd: int = -1  # --host-fd: link to the process hosting 'external' models (instances/external.py)
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)  # --openai-port (openai_api/)
    inert_flags: tuple[str, ...] = ()  # tritonserver flags given that change nothing here (logged at start)
