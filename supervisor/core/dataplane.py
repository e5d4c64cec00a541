"""The interface the frontends (HTTP, gRPC, OpenAI) call, and its two kinds: in process and remote.

`DataPlane` is what a frontend may ask: the answers every data plane has at hand (health, server metadata,
a model resolved into a handle, model readiness, client shared memory on the request path) synchronously,
inference, and the control calls (statistics, status, repository, settings, shm registration) as
coroutines, so one frontend code serves both kinds without asking which it has. `InProcessDataPlane`
answers the control calls from synchronous forms of its own (core.dataplane_impl.ServerDataPlane, the
server's), which in-process callers (the frontend processes' core side, the OpenAI frontend) may call
directly; a frontend process's `frontend_processes.remote_dataplane.RemoteDataPlane` asks the core for them.

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

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest, InferResponse
from .model_handle import ModelHandle


class ResponseError(InferdError):
    """A failure that is the request's answer: the request was accepted, then the model (or running it) failed
    it. `stream_infer` raises these, while a refusal of the request itself (unknown model, bad input, full
    queue) stays a plain InferdError: Triton answers the two differently on /generate_stream (an error
    response starts the event stream with status 400; a refusal is a plain JSON error with its status)."""


class DataPlane(abc.ABC):
    # ---- health and metadata: answered at once (a frontend process: from the core's last snapshot) ----
    @abc.abstractmethod
    def live(self) -> bool: ...

    @abc.abstractmethod
    def ready(self) -> bool:
        """Server ready (with --strict-readiness: every loaded model ready). False while draining."""

    @abc.abstractmethod
    def server_metadata(self) -> dict[str, Any]:
        """{"name": str, "version": str, "extensions": [str, ...]}"""

    @abc.abstractmethod
    def model(self, name: str, version: str = "") -> ModelHandle:
        """`name` at `version` ("" = the version policy's choice) resolved once for a request: its handle
        (core/model_handle.py), which the frontend reads and puts on the InferRequest it builds
        (InferRequest.model). Raises NOT_FOUND for an unknown model or version (INVALID_ARG for a name of
        several models with --model-namespacing); a version that is not ready resolves (its metadata and
        its inference answer UNAVAILABLE)."""

    @abc.abstractmethod
    def model_ready(self, name: str, version: str = "") -> bool:
        """False when the version is not READY or unknown."""

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

    @abc.abstractmethod
    def metrics_text(self) -> bytes:
        """Prometheus text exposition for :8002/metrics (served by the core process only)."""

    def trace_of(self, context: str) -> Any:
        """What a BLS call naming trace `context` continues (see ServerDataPlane); None: not traced here."""
        return None

    # ---- control calls: awaited by every frontend (a frontend process asks the core) ----
    async def ready_async(self) -> bool:
        """What the server readiness endpoints answer: `ready`, and with --strict-readiness the is_ready()
        checks of the models defining one (core/readiness.py)."""
        return self.ready()

    async def model_ready_async(self, name: str, version: str = "") -> bool:
        """What the model readiness endpoints answer: `model_ready`, and for a Python model defining
        is_ready() (python_backend after 2.51) that check's answer too (core/readiness.py)."""
        return self.model_ready(name, version)

    @abc.abstractmethod
    async def model_statistics_async(self, name: str = "", version: str = "") -> dict[str, Any]:
        """{"model_stats": [...]} (reference/triton.md §7.2); "" name = every model."""

    async def metrics_text_async(self) -> bytes:
        return self.metrics_text()

    async def load_report_async(self, fmt: str, model: str = "") -> str | None:
        """The `endpoint-load-metrics` header for a request to `model` that asked for one in `fmt` ("text" or
        "json"; orca.py), or None when there is nothing to report. Default: nothing."""
        return None

    async def status_async(self, name: str = "") -> dict[str, Any]:
        """inferd's own status view (infer-ctl status): {"models": [{"name","version","state","reason",
        "instances": [{"name","pid","state","restarts","inflight","last_error"}]}]}"""
        raise InferdError(ErrorCode.UNSUPPORTED, "status is not available")

    @abc.abstractmethod
    async def repository_index_async(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """[{"name", "version"?, "state"?, "reason"?}, ...]"""

    @abc.abstractmethod
    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """parameters: optional "config" (JSON text) and "file:<version>/<path>" (bytes) overrides."""

    @abc.abstractmethod
    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    async def restart_model(self, name: str) -> dict[str, Any]:
        """Replace every instance's worker of `name` without a gap (core/restart.py; infer-ctl restart)."""
        raise InferdError(ErrorCode.UNSUPPORTED, "restart is not available here")

    @abc.abstractmethod
    async def log_settings_async(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        """The log settings (trace / logging extensions) after applying `update`."""

    @abc.abstractmethod
    async def trace_settings_async(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace settings of `model` ("" the global ones) after applying `update` (key -> str, [str] or
        None to clear), as the HTTP JSON shows them; a refused update changes nothing."""

    @abc.abstractmethod
    async def shm_status_async(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """kind "system" | "cuda"; entries as in Triton's JSON status."""

    @abc.abstractmethod
    async def shm_register_async(self, kind: str, name: str, **fields: Any) -> None:
        """system: key, offset, byte_size; cuda: raw_handle (bytes), device_id, byte_size."""

    @abc.abstractmethod
    async def shm_unregister_async(self, kind: str, name: str = "") -> None: ...

    # ---- client shared memory on the request path: synchronous in both kinds (a frontend process reads
    # and writes the regions itself) ----
    def shm_check_allowed(self) -> None:
        """Raise as Triton does when client shared memory is disabled (before a register body is read);
        the default allows it."""
        return None

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


class InProcessDataPlane(DataPlane):
    """A data plane in the server's own process: the control calls answered at once by synchronous forms,
    which in-process callers may also call directly (the core's end of the frontend links, the OpenAI
    frontend). The one implementation: core.dataplane_impl.ServerDataPlane (and tests' small ones)."""

    @abc.abstractmethod
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]: ...

    def load_report(self, fmt: str, model: str = "") -> str | None:
        return None

    def status(self, name: str = "") -> dict[str, Any]:
        raise InferdError(ErrorCode.UNSUPPORTED, "status is not available")

    @abc.abstractmethod
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def shm_status(self, kind: str, name: str = "") -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def shm_register(self, kind: str, name: str, **fields: Any) -> None: ...

    @abc.abstractmethod
    def shm_unregister(self, kind: str, name: str = "") -> None: ...

    # the DataPlane control calls, over the forms above
    async def model_statistics_async(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self.model_statistics(name, version)

    async def metrics_text_async(self) -> bytes:
        return self.metrics_text()

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
