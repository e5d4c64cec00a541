"""The interface the frontends (HTTP, gRPC) call. One implementation: core.dataplane_impl.ServerDataPlane.

Every method raises wire.errors.InferdError with a protocol-neutral code on failure; each frontend
maps codes to its statuses in its own single table. Dict shapes are the Triton JSON shapes
(reference/triton.md §1 and §7.2), so the HTTP frontend can serialize them as they are and the gRPC
frontend converts them to protobuf messages.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator
from typing import Any

from inferd.worker.wire.errors import InferdError

from ..inference.types import InferRequest, InferResponse


class ResponseError(InferdError):
    """A failure that is the request's answer: the request was accepted, then the model (or running it) failed
    it. `stream_infer` raises these, while a refusal of the request itself (unknown model, bad input, full
    queue) stays a plain InferdError: Triton answers the two differently on /generate_stream (an error
    response starts the event stream with status 400; a refusal is a plain JSON error with its status)."""


class DataPlane(abc.ABC):
    # True for a frontend process's data plane (scaleout.RemoteDataPlane), whose statistics, status, index,
    # settings and shm registry live in the core: the frontends then await the `*_async` forms (end of
    # this class) instead of calling the synchronous ones. False here: nothing changes for one process.
    remote: bool = False

    # ---- health and metadata ----
    @abc.abstractmethod
    def live(self) -> bool: ...

    @abc.abstractmethod
    def ready(self) -> bool:
        """Server ready (with --strict-readiness: every loaded model ready). False while draining."""

    @abc.abstractmethod
    def server_metadata(self) -> dict[str, Any]:
        """{"name": str, "version": str, "extensions": [str, ...]}"""

    @abc.abstractmethod
    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """{"name", "versions": [str], "platform", "inputs": [{"name","datatype","shape"}], "outputs": [...]}"""

    @abc.abstractmethod
    def model_ready(self, name: str, version: str = "") -> bool:
        """False when the version is not READY; raises INVALID_ARG for an unknown model."""

    async def model_ready_async(self, name: str, version: str = "") -> bool:
        """What the model readiness endpoints answer: `model_ready`, and for a Python model defining
        is_ready() (python_backend after 2.51) that check's answer too (core/readiness.py)."""
        return self.model_ready(name, version)

    async def ready_async(self) -> bool:
        """What the server readiness endpoints answer: `ready`, and with --strict-readiness the is_ready()
        checks of the models defining one."""
        return self.ready()

    @abc.abstractmethod
    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The normalised ModelConfig in Triton's JSON rendering (preserved field names, all fields)."""

    @abc.abstractmethod
    def model_is_decoupled(self, name: str, version: str = "") -> bool: ...

    # ---- inference ----
    @abc.abstractmethod
    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request (non-decoupled). Cancelling the awaiting task cancels the request."""

    def infer_nowait(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """`infer` started at once, as a future (cancelling it cancels the request). Errors found before
        the request is queued may be raised here. Default: `infer` in a task."""
        return asyncio.ensure_future(self.infer(request))

    async def stream_infer(self, request: InferRequest) -> AsyncIterator[InferResponse | InferdError]:
        """Responses of one request on a stream. Decoupled models: any number, each marked final or
        not with parameters["triton_final_response"]; an error response that does not end the
        request is yielded as an InferdError, one that ends it is raised. Closing the iterator early
        cancels the request. Default: the one response of `infer`."""
        yield await self.infer(request)

    # ---- statistics ----
    @abc.abstractmethod
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """{"model_stats": [...]} (reference/triton.md §7.2); "" name = every model."""

    @abc.abstractmethod
    def metrics_text(self) -> bytes:
        """Prometheus text exposition for :8002/metrics."""

    def load_report(self, fmt: str, model: str = "") -> str | None:
        """The `endpoint-load-metrics` header for a request to `model` that asked for one in `fmt` ("text" or
        "json"; orca.py), or None when there is nothing to report. Default: nothing."""
        return None

    # ---- repository extension ----
    @abc.abstractmethod
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """[{"name", "version"?, "state"?, "reason"?}, ...]"""

    @abc.abstractmethod
    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """parameters: optional "config" (JSON text) and "file:<version>/<path>" (bytes) overrides."""

    @abc.abstractmethod
    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    async def restart_model(self, name: str) -> dict[str, Any]:
        """Replace every instance's worker of `name` without a gap (core/restart.py; infer-ctl restart)."""
        from inferd.worker.wire.errors import ErrorCode, InferdError

        raise InferdError(ErrorCode.UNSUPPORTED, "restart is not available here")

    # ---- inferd's own status view (infer-ctl status) ----
    def status(self, name: str = "") -> dict[str, Any]:
        """{"models": [{"name","version","state","reason","instances": [{"name","pid","state","restarts",
        "inflight","last_error"}]}]}"""
        from inferd.worker.wire.errors import ErrorCode, InferdError

        raise InferdError(ErrorCode.UNSUPPORTED, "status is not available")

    # ---- settings (trace / logging extensions) ----
    @abc.abstractmethod
    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace settings of `model` ("" the global ones) after applying `update` (key -> str, [str] or
        None to clear), as the HTTP JSON shows them; a refused update changes nothing."""

    def trace_of(self, context: str) -> Any:
        """What a BLS call naming trace `context` continues (see ServerDataPlane); None: not traced here."""
        return None

    # ---- system shared memory extension ----
    def shm_check_allowed(self) -> None:
        """Raise as Triton does when client shared memory is disabled (before a register body is read);
        the default allows it."""
        return None

    @abc.abstractmethod
    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """kind "system" | "cuda"; entries as in Triton's JSON status."""

    @abc.abstractmethod
    def shm_register(self, kind: str, name: str, **fields: Any) -> None:
        """system: key, offset, byte_size; cuda: raw_handle (bytes), device_id, byte_size."""

    @abc.abstractmethod
    def shm_unregister(self, kind: str, name: str = "") -> None: ...

    @abc.abstractmethod
    def shm_read(self, region: str, offset: int, byte_size: int, device_ok: bool = False) -> Any:
        """Bytes of a registered region (input tensors given by shared_memory_region). With `device_ok`
        (the frontend needs no host bytes: not BYTES), a CUDA region's input may stay on its GPU: a
        memory.cuda_regions.CudaSpan, which the core copies to the host for a model that needs it."""

    # True where the cuda_shared_memory extension works (a CUDA runtime, >= 1 GPU, client shm allowed)
    cuda_shared_memory_supported: bool = False

    def shm_is_cuda(self, region: str) -> bool:
        """Whether `region` is a registered CUDA region: a request whose every output goes to one asks
        its model for device outputs (InferRequest.device_outputs), copied device to device there."""
        return False

    @abc.abstractmethod
    def shm_write(self, region: str, offset: int, data: Any) -> None:
        """Write an output into a registered region (outputs with shared_memory_region)."""

    def shm_check(self, region: str, offset: int, byte_size: int) -> None:
        """Triton's checks of a tensor's window in a registered region, as a request naming it is read
        (outputs too): NOT_FOUND for an unknown region, INVALID_ARG with Triton's words out of bounds."""
        return None

    def shm_hold(self, names: Any) -> Any:
        """Hold the registered regions among `names` for a request in flight: a memory.client_shm.ShmHold
        (None when none is registered), released when collected; unregistering a held region is refused."""
        return None

    # ---- the queries and settings above, awaitable: the gRPC servicer always awaits these; HTTP routes
    # answer at once from the plain forms unless `remote` (a frontend process, scaleout/) ----
    async def model_statistics_async(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self.model_statistics(name, version)

    async def load_report_async(self, fmt: str, model: str = "") -> str | None:
        return self.load_report(fmt, model)

    async def status_async(self, name: str = "") -> dict[str, Any]:
        return self.status(name)

    async def repository_index_async(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.repository_index(ready_only)

    async def log_settings_async(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.log_settings(update)

    async def trace_settings_async(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.trace_settings(model, update)

    async def shm_status_async(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        return self.shm_status(kind, name)

    async def shm_register_async(self, kind: str, name: str, **fields: Any) -> None:
        self.shm_register(kind, name, **fields)

    async def shm_unregister_async(self, kind: str, name: str = "") -> None:
        self.shm_unregister(kind, name)
