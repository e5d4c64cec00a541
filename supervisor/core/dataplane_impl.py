"""ServerDataPlane: the server's data plane (in process), over the model registry (models.py) and schedulers.

Every request is resolved (resolution.py) and routed here: a frontend's, which comes with the model handle
the frontend resolved (InferRequest.model), a BLS call's (through `infer` / `stream_infer`, by name) and an
ensemble step's (`call_step` / `stream_step`); the registry only holds the versions and their state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .. import logs
from ..inference.types import InferRequest, InferResponse
from ..memory.cuda_regions import CudaSpan
from ..response_cache import ResponseCache, infer_cached
from ..tracing import live
from ..tracing.options import TraceOptions
from ..tracing.tracer import Tracer
from . import classification, readiness
from .busy_poll import BusyPoll
from .dataplane import InProcessDataPlane, ResponseError
from .models import ModelManager, ModelVersion
from .resolution import LocalModel, Resolution
from .restart import restart_model
from .shm_endpoints import ShmEndpoints
from .status_json import status_json
from .streaming import ResponseStream
from .validate import validate_request

log = logging.getLogger("inferd.core")

SERVER_VERSION = "2.51.0"
FINAL_FLAG = "triton_final_response"  # response parameter marking a decoupled request's last response
# Triton's extension names in Triton's order. Server metadata lists only those that work here:
# `cuda_shared_memory` when the CUDA shm data path says so.
TRITON_EXTENSIONS = (
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "trace", "logging",
)


def extensions(*, cuda_shared_memory: bool, trace: bool = False) -> list[str]:
    """The extensions server metadata advertises, given what works."""
    works = {"cuda_shared_memory": cuda_shared_memory, "trace": trace}
    return [name for name in TRITON_EXTENSIONS if works.get(name, True)]


class ServerDataPlane(Resolution, ShmEndpoints, InProcessDataPlane):
    def __init__(self, manager: ModelManager, *, server_id: str, control_mode: str, strict_readiness: bool,
                 stats_registry: Any, metrics_renderer: Any, shm: Any = None,
                 response_cache: ResponseCache | None = None, log_settings: dict[str, Any] | None = None,
                 busy_poll: BusyPoll | None = None, cuda_shared_memory_supported: bool | None = None,
                 tracer: Tracer | None = None, load_reporter: Any = None) -> None:
        Resolution.__init__(self, manager)
        self.load_reporter = load_reporter  # (format, model) -> the endpoint-load-metrics header or None (orca.py)
        self.busy_poll = busy_poll  # None: the event loop sleeps whenever it has nothing to do
        self.response_cache = response_cache  # None: no --cache-config, nothing is cached
        self.server_id = server_id
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness
        self.stats_registry = stats_registry
        self.metrics_renderer = metrics_renderer
        # set by the frontend processes: awaited before statistics are read (they relay the direct path's figures)
        self.stats_pull: Callable[[], Awaitable[None]] | None = None
        # and their requests in flight on an instance, by (version serial, instance name), as last pulled
        self.direct_inflight: Callable[[int, str], int] | None = None
        self.shm = shm
        # the one capability behind the cuda_shared_memory extension: by default client shm allowed and
        # memory.cuda_device.probe's start-up answer (a GPU device node, a CUDA binding installed)
        if cuda_shared_memory_supported is None:
            cuda_shared_memory_supported = bool(shm is not None and getattr(shm, "cuda_available", False))
        self.cuda_shared_memory_supported = cuda_shared_memory_supported
        self.started = False  # set once start-up loading is done
        self.draining = False
        self._log_settings: dict[str, Any] = {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default",
        }
        self._log_settings.update(log_settings or {})
        self.tracer = tracer if tracer is not None else Tracer(TraceOptions())
        manager.steps = self

    # ---- health and metadata ----
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if not self.started or self.draining:
            return False
        return self.manager.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": SERVER_VERSION,
                "extensions": extensions(cuda_shared_memory=self.cuda_shared_memory_supported, trace=True)}

    def model(self, name: str, version: str = "") -> LocalModel:
        """DataPlane.model; a handle made in this generation is taken here (resolution.Resolution.model's
        first step, inline: the request path calls no other file for its model)."""
        handle = self._handles.get((name, version) if version else name)
        return handle if handle is not None else Resolution.model(self, name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            mv = self.resolve(name, version)
        except InferdError:
            return False  # as Triton: an unknown model or version is simply not ready
        return mv.ready

    async def model_ready_async(self, name: str, version: str = "") -> bool:
        return await readiness.model_ready(self, name, version)

    async def ready_async(self) -> bool:
        return await readiness.server_ready(self)

    # ---- inference ----
    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.infer_nowait(request)

    def infer_nowait(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """The request checked and queued at once: its scheduler's future, whose response carries the model's
        name and version and the request id (no task or coroutine per request: cheaper)."""
        mv = self._resolve(request)
        if mv.decoupled:
            raise InferdError(ErrorCode.UNSUPPORTED,
                              "ModelInfer RPC doesn't support models with decoupled transaction policy")
        try:  # (_checked, inline: the one request path pays no extra calls)
            if self.shm is not None and (not mv.device_inputs or mv.host_only_inputs):
                for t in request.inputs:
                    if type(t.data) is CudaSpan:  # (none in a client's CUDA region: no call)
                        self._inputs_to_host(request, mv)
                        break
            validate_request(mv.io, request)
        except InferdError:
            mv.stats.record_failure("OTHER", 0)
            raise
        wanted = classification.requested(request.outputs) if request.outputs else None
        traced = live.armed and self.tracer.begin(mv.name, str(mv.version), request)  # off: one check
        try:
            if mv.cache_generation and self.response_cache is not None:
                future: asyncio.Future[InferResponse] = asyncio.ensure_future(
                    infer_cached(self.response_cache, mv, request))
            else:
                future = mv.scheduler.submit(request)
        except BaseException:
            if traced:  # refused at once (a full queue...): the trace ends here
                self.tracer.abandon(request)
            raise
        if traced:
            self.tracer.watch(request.trace, future)
        if wanted is not None:
            return asyncio.ensure_future(_classified(future, mv, wanted))
        return future

    def _resolve(self, request: InferRequest) -> ModelVersion:
        """The ready version a request names (UNAVAILABLE while draining): its handle's when a frontend
        resolved one (resolution.Resolution.ready_version), else by name; wakes the busy poller."""
        if self.draining:
            raise InferdError(ErrorCode.UNAVAILABLE, "Server is shutting down")
        handle = request.model
        if handle is None:
            mv = self.resolve_ready(request.model_name, request.model_version)
        elif handle.generation == self.generation and (handle.checked or handle.mv.ready):
            mv = handle.mv  # (Resolution.ready_version's common case, inline: no call per request)
        else:
            mv = self.ready_version(handle)  # resolved again, or refused, as by name
        if self.busy_poll is not None:
            self.busy_poll.poke(mv.scheduler.idle)
        return mv

    def _checked(self, mv: ModelVersion, request: InferRequest, to_host: bool) -> dict[str, int] | None:
        """The request validated against its model (inputs in client shared memory read to host first when `to_host`);
        returns the classification the outputs ask for, or None. A refusal counts as a failure."""
        self._validated(mv, request, to_host)
        return classification.requested(request.outputs) if request.outputs else None

    def _validated(self, mv: ModelVersion, request: InferRequest, to_host: bool) -> None:
        try:
            if to_host:
                self._inputs_to_host(request, mv)
            validate_request(mv.io, request)
        except InferdError:
            mv.stats.record_failure("OTHER", 0)
            raise

    def _submit_traced(self, mv: ModelVersion, request: InferRequest) -> asyncio.Future[InferResponse]:
        """The scheduler's future; a trace (when tracing is on) ends with the execution."""
        if live.armed:
            return self.tracer.submit(mv.name, str(mv.version), request, mv.scheduler.submit)
        return mv.scheduler.submit(request)

    async def stream_infer(self, request: InferRequest) -> AsyncIterator[InferResponse | InferdError]:
        """Responses of one request as they come. Decoupled models: any number, each marked with
        parameters[FINAL_FLAG]; a non-final error response is yielded as an InferdError, a final one
        raised. Other models: the one response of `infer`. Closing the iterator early (the client
        went away) cancels the request: dropped from its queue, or the model sees is_cancelled()."""
        mv = self._resolve(request)
        if not mv.decoupled:
            future = self.infer_nowait(request)  # (a refusal raises here, as it is)
            try:
                response = await future
            except ResponseError:
                raise
            except InferdError as exc:  # accepted, then failed: the request's answer (ResponseError's docstring)
                raise ResponseError(exc.code, exc.message) from None
            yield response
            return
        wanted = self._checked(mv, request, self.shm is not None)
        stream = ResponseStream()
        if mv.stats.first_response is not None:
            stream.first_response = (mv.stats.first_response, request.arrival_ns)
        request.response_sink = stream
        # a trace ends with the execution (its compute stamps come as it returns), not the last response
        future = self._submit_traced(mv, request)
        stream.watch(future)
        name, version = mv.name, str(mv.version)
        ended = False
        try:
            while True:
                item, final = await stream.get()
                ended = final
                if isinstance(item, InferdError):
                    if final:
                        raise item if isinstance(item, ResponseError) else ResponseError(item.code, item.message)
                    yield item
                    continue
                item.model_name, item.model_version, item.id = name, version, request.id
                if wanted is not None:
                    classification.apply(item, wanted, mv.labels, _batched(mv))
                item.parameters[FINAL_FLAG] = final
                yield item
                if final:
                    return
        finally:
            if not ended:
                stream.abandon(future)

    # ---- internal requests (ensemble steps) ----
    async def call_step(self, request: InferRequest) -> InferResponse:
        """An ensemble step to a model that is not decoupled: resolved, checked and scheduled as a client's
        request (no response cache, no classification); its response."""
        mv = self.resolve_ready(request.model_name, request.model_version)
        if mv.decoupled:
            raise InferdError(ErrorCode.UNSUPPORTED, "model '%s' is decoupled; decoupled ensemble steps are "
                              "not supported yet" % mv.name)
        self._validated(mv, request, False)
        future = self._submit_traced(mv, request)
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()
            raise

    async def stream_step(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """An ensemble step to a decoupled model: its responses as they come; an error response raises.
        Closing the iterator early cancels the request."""
        mv = self.resolve_ready(request.model_name, request.model_version)
        self._validated(mv, request, False)
        stream = ResponseStream()
        if mv.stats.first_response is not None:
            stream.first_response = (mv.stats.first_response, request.arrival_ns)
        request.response_sink = stream
        future = mv.scheduler.submit(request)
        stream.watch(future)
        ended = False
        try:
            while not ended:
                item, ended = await stream.get()
                if isinstance(item, InferdError):
                    raise item
                yield item
        finally:
            if not ended:
                stream.abandon(future)

    # ---- statistics ----
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if name:
            try:
                mv = self.resolve(name, version)
            except InferdError as exc:  # a name of several models (--model-namespacing): Triton's answer
                if exc.code == ErrorCode.INVALID_ARG and self.manager.namespacing:
                    raise InferdError(ErrorCode.INVALID_ARG, "requested model '%s' is not available" % name) from None
                raise
            if version:
                return self.stats_registry.to_json(name, str(mv.version))
        return self.stats_registry.to_json(name, version)

    def metrics_text(self) -> bytes:
        return self.metrics_renderer()

    async def model_statistics_async(self, name: str = "", version: str = "") -> dict[str, Any]:
        if self.stats_pull is not None:  # frontend processes hold figures of requests they sent straight
            await self.stats_pull()
        return self.model_statistics(name, version)

    async def metrics_text_async(self) -> bytes:
        if self.stats_pull is not None:
            await self.stats_pull()
        return self.metrics_text()

    def load_report(self, fmt: str, model: str = "") -> str | None:
        return self.load_reporter(fmt, model) if self.load_reporter is not None else None

    # ---- repository ----
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.manager.index(ready_only)

    def _check_explicit(self) -> None:
        if self.control_mode != "explicit":
            raise InferdError(ErrorCode.UNAVAILABLE,
                              "explicit model load / unload is not allowed if polling is enabled")

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._check_explicit()
        config = parameters.get("config")
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if key.startswith("file:"):  # bytes: the HTTP frontend decodes JSON's base64, gRPC sends bytes
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise InferdError(ErrorCode.INVALID_ARG, "file parameter '%s' must be bytes" % key)
                files[key[len("file:"):]] = bytes(value)
            elif key != "config":
                raise InferdError(ErrorCode.INVALID_ARG, "unexpected load parameter '%s'" % key)
        if files and config is None:
            raise InferdError(ErrorCode.INVALID_ARG,
                              "failed to load '%s', failed to poll from override directory: 'config' parameter "
                              "must be specified along with 'file:' parameters" % name)
        if config is not None and not isinstance(config, str):
            raise InferdError(ErrorCode.INVALID_ARG, "load parameter 'config' must be a string")
        await self.manager.load(name, config, files or None)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_explicit()
        await self.manager.unload(name, unload_dependents)

    async def restart_model(self, name: str) -> dict[str, Any]:
        return await restart_model(self.manager, name)

    def status(self, name: str = "") -> dict[str, Any]:
        if name:
            self.resolve(name)  # NOT_FOUND for an unknown model
        return status_json(self.manager, name, self.direct_inflight)

    async def status_async(self, name: str = "") -> dict[str, Any]:
        if self.stats_pull is not None:  # (the pull brings the frontends' in-flight counts too)
            await self.stats_pull()
        return self.status(name)

    # ---- settings ----
    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET / POST /v2/logging. A change applies to the supervisor's log at once, and to the workers'
        model logging (pb_utils.Logger) when each reads the LogSettings message sent to it."""
        if update:
            settings = logs.updated(self._log_settings, update)
            logs.apply(settings["log_verbose_level"], settings["log_format"], settings["log_info"],
                       settings["log_warning"], settings["log_error"])
            self._log_settings = settings
            # running workers too: models' pb_utils.Logger follows the settings, as in Triton
            runtime = getattr(getattr(self.manager, "settings", None), "runtime", None)
            if runtime is not None:  # None: a server without workers (unit tests)
                runtime.channel.broadcast(m.encode(m.LogSettings(*logs.worker_levels())))
        return dict(self._log_settings)

    def trace_of(self, context: str) -> Any:
        """What a BLS call continues: its caller's trace (pb_utils InferenceRequest(trace=request.trace())),
        or tracing.record.UNTRACED (as Triton, a BLS call is traced only with its caller's trace)."""
        return self.tracer.trace_of(context)

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        if model:
            try:
                self.resolve_ready(model)
            except InferdError:  # as Triton: a model with no ready version is unknown here
                raise InferdError(ErrorCode.INVALID_ARG, "Request for unknown model : %s" % model) from None
        if update is not None:
            self.tracer.update(model, update)
        return self.tracer.settings.get(model)

    def _inputs_to_host(self, request: InferRequest, mv: ModelVersion) -> None:
        """Inputs still in a client's CUDA region copied to the host, for a model that cannot take them
        on the device (see models.ModelVersion.device_inputs); the others go to the worker as CUDA refs."""
        for t in request.inputs:
            if type(t.data) is CudaSpan and not (mv.device_inputs and t.name not in mv.host_only_inputs):
                t.data = self.shm.to_host(t.data)


def _batched(mv: ModelVersion) -> bool:
    return int(mv.config.get("max_batch_size") or 0) > 0


async def _classified(future: asyncio.Future[InferResponse], mv: ModelVersion,
                      wanted: dict[str, int]) -> InferResponse:
    """The response of `future` with the outputs in `wanted` classified (cancelling this cancels `future`)."""
    return classification.apply(await future, wanted, mv.labels, _batched(mv))
