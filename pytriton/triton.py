"""`Triton` and `TritonConfig`: serve Python functions through inferd, as PyTriton serves them through Triton.

The server is a child process (`python -m inferd.supervisor`, explicit model control) linked to this
process by a socket pair (`--host-fd`): this process hosts the bound functions as the workers of their
models (host.py); the server owns the frontends, queues, batching and statistics. When this process
exits, however it exits, the link closes and the server shuts down; when the server dies, `is_alive()`
turns false.
"""

from __future__ import annotations

import atexit
import dataclasses
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

from .exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError, PyTritonUnrecoverableError
from .host import Host
from .model_config import ModelConfig, Tensor
from .model_spec import BoundModel

DEFAULT_TIMEOUT_S = 120.0
_ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"


@dataclasses.dataclass
class TritonConfig:
    """Server options (tritonserver's flag names; None: the server's default)."""

    model_repository: Optional[pathlib.Path] = None
    id: Optional[str] = None
    log_verbose: Optional[int] = None
    log_file: Optional[pathlib.Path] = None
    exit_timeout_secs: Optional[int] = None
    exit_on_error: Optional[bool] = None
    strict_readiness: Optional[bool] = None
    allow_http: Optional[bool] = None
    http_address: Optional[str] = None
    http_port: Optional[int] = None
    http_header_forward_pattern: Optional[str] = None
    http_thread_count: Optional[int] = None
    http_restricted_api: Optional[str] = None
    allow_grpc: Optional[bool] = None
    grpc_address: Optional[str] = None
    grpc_port: Optional[int] = None
    grpc_header_forward_pattern: Optional[str] = None
    grpc_infer_allocation_pool_size: Optional[int] = None
    grpc_use_ssl: Optional[bool] = None
    grpc_use_ssl_mutual: Optional[bool] = None
    grpc_server_cert: Optional[pathlib.Path] = None
    grpc_server_key: Optional[pathlib.Path] = None
    grpc_root_cert: Optional[pathlib.Path] = None
    grpc_infer_response_compression_level: Optional[str] = None
    grpc_keepalive_time: Optional[int] = None
    grpc_keepalive_timeout: Optional[int] = None
    grpc_keepalive_permit_without_calls: Optional[bool] = None
    grpc_http2_max_pings_without_data: Optional[int] = None
    grpc_http2_min_recv_ping_interval_without_data: Optional[int] = None
    grpc_http2_max_ping_strikes: Optional[int] = None
    grpc_restricted_protocol: Optional[str] = None
    allow_metrics: Optional[bool] = None
    allow_gpu_metrics: Optional[bool] = None
    allow_cpu_metrics: Optional[bool] = None
    metrics_interval_ms: Optional[int] = None
    metrics_port: Optional[int] = None
    metrics_address: Optional[str] = None
    allow_sagemaker: Optional[bool] = None
    sagemaker_port: Optional[int] = None
    sagemaker_safe_port_range: Optional[str] = None
    sagemaker_thread_count: Optional[int] = None
    allow_vertex_ai: Optional[bool] = None
    vertex_ai_port: Optional[int] = None
    vertex_ai_thread_count: Optional[int] = None
    vertex_ai_default_model: Optional[str] = None
    metrics_config: Optional[list] = None
    trace_config: Optional[list] = None
    cache_config: Optional[list] = None
    cache_directory: Optional[str] = None
    buffer_manager_thread_count: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})

    @classmethod
    def from_env(cls) -> TritonConfig:
        """`PYTRITON_TRITON_CONFIG_<FIELD>` variables (e.g. PYTRITON_TRITON_CONFIG_GRPC_PORT=45436)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = os.environ.get(_ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            kind = str(f.type)
            if "bool" in kind:
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif "int" in kind:
                values[f.name] = int(raw)
            elif "list" in kind:
                values[f.name] = [p for p in raw.split(",") if p]
            else:
                values[f.name] = raw
        return cls(**values)


# fields passed to the server as flags of the same name (others are accepted and have no effect here)
_FLAGS = (
    "id", "log_verbose", "log_file", "exit_timeout_secs", "exit_on_error", "strict_readiness", "allow_http",
    "http_address", "http_port", "http_header_forward_pattern", "allow_grpc", "grpc_address", "grpc_port",
    "grpc_header_forward_pattern", "grpc_use_ssl", "grpc_use_ssl_mutual", "grpc_server_cert", "grpc_server_key",
    "grpc_root_cert", "allow_metrics", "allow_gpu_metrics", "allow_cpu_metrics", "metrics_interval_ms",
    "metrics_port", "metrics_address", "metrics_config", "cache_config",
)
_REPEATED_BY_SEMICOLON = ("http_restricted_api", "grpc_restricted_protocol")


def server_flags(config: TritonConfig) -> list[str]:
    flags: list[str] = []
    for name in _FLAGS + _REPEATED_BY_SEMICOLON:
        value = getattr(config, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "id":
            flag = "--id"
        values = value if isinstance(value, list) else (
            str(value).split(";") if name in _REPEATED_BY_SEMICOLON else [value])
        for v in values:
            text = ("true" if v else "false") if isinstance(v, bool) else str(v)
            flags.append("%s=%s" % (flag, text))
    return flags


@dataclasses.dataclass
class TritonLifecyclePolicy:
    launch_triton_on_startup: bool = True
    local_model_store: bool = False


class Triton:
    """Serve bound Python functions (and, with `TritonConfig.model_repository`, a model repository too)."""

    def __init__(self, *, config: Optional[TritonConfig] = None, workspace: Union[str, pathlib.Path, None] = None,
                 triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None, **_: Any) -> None:
        merged = {k: v for k, v in TritonConfig.from_env().to_dict().items() if v is not None}
        merged.update({k: v for k, v in (config.to_dict() if config else {}).items() if v is not None})
        self._config = TritonConfig(**merged)
        self._policy = triton_lifecycle_policy or TritonLifecyclePolicy()
        self._workspace_arg = workspace
        self._workspace: Optional[str] = None
        self._models: dict[str, BoundModel] = {}
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._host: Optional[Host] = None
        self._lock = threading.Condition()
        self._connected = False
        self._stopped = False
        self._server_gone = threading.Event()

    # ---- endpoints ----
    @property
    def _http_port(self) -> int:
        return int(self._config.http_port or 8000)

    def _http_host(self) -> str:  # the server is ours: reach it on loopback unless it listens elsewhere only
        address = self._config.http_address or "127.0.0.1"
        return "127.0.0.1" if address in ("0.0.0.0", "::", "") else address

    # ---- binding ----
    def bind(self, model_name: str, infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]]],
             inputs: Sequence[Tensor], outputs: Sequence[Tensor], model_version: int = 1,
             config: Optional[ModelConfig] = None, strict: bool = False, trace_config: Optional[list] = None) -> None:
        """Serve `infer_func` (or one callable per instance) as `model_name`; loaded at once if the server runs."""
        if self._stopped:
            raise PyTritonInvalidOperationError("this Triton has been stopped")
        with self._lock:
            if model_name in self._models:
                raise PyTritonInvalidOperationError("model '%s' is already bound" % model_name)
            model = BoundModel.create(model_name, infer_func, inputs, outputs, config, strict)
            self._models[model_name] = model
        if self._proc is not None:
            model.write(self._repository())
            try:
                self._load(model_name)
            except BaseException:
                with self._lock:
                    self._models.pop(model_name, None)  # the name may be bound again
                raise

    # ---- lifecycle ----
    def __enter__(self) -> Triton:
        if self._policy.launch_triton_on_startup:
            self._run_server()
            self.connect()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def run(self) -> None:
        """Start the server (if not started) and wait until every bound model is ready."""
        self._run_server()
        self.connect()

    def serve(self, monitoring_period_s: float = 60.0) -> None:
        """`run()`, then block until `stop()`, SIGINT/SIGTERM or the server's exit; then stop."""
        self.run()
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: self._server_gone.set())
        try:
            while self.is_alive():
                self._server_gone.wait(timeout=monitoring_period_s)
        except KeyboardInterrupt:
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.stop()

    def connect(self) -> None:
        """Wait until the server answers and every bound model is ready (TimeoutError after 120 s)."""
        if self._proc is None:
            raise PyTritonInvalidOperationError("the server is not running: call run() or serve()")
        self._wait_ready()
        self._connected = True

    def is_connected(self) -> bool:
        return self._connected and self.is_alive()

    def is_alive(self) -> bool:
        proc = self._proc
        return proc is not None and not self._stopped and proc.poll() is None and not self._server_gone.is_set()

    def stop(self) -> bool:
        """Stop the server (drains in-flight requests), end the hosted workers, remove the workspace."""
        with self._lock:
            if self._stopped:
                return False
            self._stopped = True
            self._connected = False
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=float(self._config.exit_timeout_secs or 30) + 10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._host is not None:
            self._host.close()
        if self._workspace is not None and self._workspace_arg is None:
            shutil.rmtree(self._workspace, ignore_errors=True)
        self._server_gone.set()
        return True

    # ---- internals ----
    def _repository(self) -> str:
        assert self._workspace is not None
        return os.path.join(self._workspace, "model-store")

    def _run_server(self) -> None:
        if self._proc is not None:
            return
        if self._stopped:
            raise PyTritonInvalidOperationError("this Triton has been stopped")
        if self._workspace_arg is not None:
            self._workspace = str(self._workspace_arg)
            os.makedirs(self._workspace, exist_ok=True)
        else:
            self._workspace = tempfile.mkdtemp(prefix="inferd-pytriton-")
        repo = self._repository()
        os.makedirs(repo, exist_ok=True)
        for model in self._models.values():
            model.write(repo)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "inferd.supervisor", "--model-repository", repo,
                "--model-control-mode", "explicit", "--host-fd", str(theirs.fileno())]
        if self._config.model_repository is not None:  # both worlds: a repository beside the bound functions
            argv += ["--model-repository", str(self._config.model_repository), "--load-model", "*"]
        else:
            for name in self._models:
                argv += ["--load-model", name]
        argv += server_flags(self._config)
        self._host = Host(ours, self._models, self._server_gone.set)
        self._host.start()
        try:
            # its own session: a terminal's Ctrl-C reaches this process only, whose stop() drains the server
            self._proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), close_fds=True, start_new_session=True)
        finally:
            theirs.close()
        atexit.register(self.stop)

    def _request(self, method: str, path: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self._http_host(), self._http_port, timeout=timeout)
        try:
            conn.request(method, path, body=body or None)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _load(self, name: str) -> None:
        """Load a model bound while the server runs; the answer comes once it is loaded (ready) or failed."""
        if self._config.allow_http is False:
            from tritonclient.grpc import InferenceServerClient, InferenceServerException

            client = InferenceServerClient("127.0.0.1:%d" % int(self._config.grpc_port or 8001))
            try:
                client.load_model(name)
            except InferenceServerException as exc:
                raise PyTritonBadParameterError("loading model '%s' failed: %s" % (name, exc.message())) from None
            finally:
                client.close()
            return
        status, body = self._request("POST", "/v2/repository/models/%s/load" % name, timeout=DEFAULT_TIMEOUT_S)
        if status != 200:
            raise PyTritonBadParameterError("loading model '%s' failed: %s" % (name, _error_text(body)))

    def _wait_ready(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Until the server says (on the host link) that it serves and its start-up loads are done."""
        host = self._host
        assert host is not None
        if not host.ready.wait(timeout_s):
            raise TimeoutError("the server is not ready after %g s" % timeout_s)
        proc = self._proc
        if host.closed or proc is None:
            code = proc.wait() if proc is not None else "?"
            raise PyTritonUnrecoverableError("the server exited during start-up (code %s): see its log above" % code)


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")
