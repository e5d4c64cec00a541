"""Protocol-neutral request and response types: what the frontends build and the core serves.

Tensor bytes stay in their wire form (little-endian, row-major; BYTES as 4-byte length prefixed
elements) from the frontend to the worker and back, so nothing is decoded twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

SEQUENCE_START = 1
SEQUENCE_END = 2


@dataclass(slots=True)
class Tensor:
    name: str
    datatype: str  # protocol name: "FP32", "BYTES", ...
    shape: list[int]
    data: Any  # bytes-like (bytes, memoryview, zmq.Frame buffer): raw wire-form bytes
    parameters: dict[str, Any] = field(default_factory=dict)
    # (region, offset) when `data` is a view of a shared-memory region a worker owns (a BLS input):
    # the next worker is handed that region by name instead of a copy
    shm_ref: tuple[str, int] | None = None
    # a device tensor (memory/device_refs.DeviceRef) that a worker keeps on its GPU: passed to the next
    # worker by CUDA IPC handle; `data` is then empty (device tensors never reach a frontend)
    device_ref: Any = None


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)  # binary_data, classification, ...


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" = the version policy's default
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty = all outputs
    parameters: dict[str, Any] = field(default_factory=dict)  # custom ones only, passed to the model
    correlation_id: int | str = 0
    flags: int = 0  # SEQUENCE_START | SEQUENCE_END
    priority: int = 0
    timeout_us: int = 0
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    # decoupled models: where the worker process delivers this request's responses as they come
    # (a core.streaming.ResponseStream); None for one response per request
    response_sink: Any = None
    # the outputs go to another worker (a BLS caller, a later ensemble step), not to a client: device
    # outputs may stay on the GPU and travel by CUDA IPC handle
    device_outputs: bool = False
    # tracing (supervisor.tracing): this request's trace while it is traced, and what it would continue:
    # its ensemble's or BLS caller's trace, tracing.record.UNTRACED, or a client's W3C traceparent
    trace: Any = None
    trace_parent: Any = None
    # the client shm regions it names, held while it is in flight (memory.client_shm.ShmHold; unregistering
    # a held region is refused, as Triton refuses it)
    shm_hold: Any = None
    # the model as the frontend resolved it for this request (core.model_handle.ModelHandle): the data plane
    # submits to it without looking the name up again; None: it resolves model_name/model_version itself
    model: Any = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)


class FirstResponseError(InferdError):
    """A non-decoupled request whose model sent a response and then failed (to Triton: two responses).
    Answered as this error, except on a stream, which delivers `response` and drops the rest (as Triton's
    gRPC stream does for a non-decoupled model)."""

    def __init__(self, code: ErrorCode, message: str, response: InferResponse) -> None:
        super().__init__(code, message)
        self.response = response
