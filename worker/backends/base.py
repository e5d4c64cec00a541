"""What every backend implements, and the backend-neutral request/response it sees.

The runtime turns wire messages into `Request` objects (inputs already numpy views) and turns the
`Response` objects back into wire messages (outputs checked against the config, sent zero-copy).
A backend never touches sockets, frames or shared memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Optional

import numpy as np

from ..wire.errors import InferdError

try:  # typing.Protocol exists from 3.8; keep the import soft for odd environments
    from typing import Protocol
except ImportError:  # pragma: no cover
    Protocol = object  # type: ignore[assignment]


class ModelSpec:
    """What AutoComplete / LoadModel say about the model and this instance."""

    __slots__ = (
        "model_name", "model_dir", "version", "config_json", "config", "backend",
        "instance_name", "instance_kind", "device_id", "backend_dir",
    )

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        version: str,
        config_json: str,
        backend: str,
        instance_name: str = "",
        instance_kind: str = "CPU",
        device_id: int = 0,
        backend_dir: str = "",
    ) -> None:
        self.model_name = model_name
        self.model_dir = model_dir
        self.version = str(version)
        self.config_json = config_json
        parsed = json.loads(config_json) if config_json else {}
        self.config: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        self.backend = backend
        self.instance_name = instance_name or model_name
        self.instance_kind = instance_kind
        self.device_id = int(device_id)
        self.backend_dir = backend_dir  # a Python-based backend's directory (its model.py is the model's code)

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.config.get("output") or [] if "name" in o]

    @property
    def decoupled(self) -> bool:
        policy = self.config.get("model_transaction_policy") or {}
        return bool(policy.get("decoupled", False))


class Tensor:
    """A named tensor: `datatype` is the protocol name ("FP32", "BYTES", "BF16"...); `array` a numpy
    array (object array of bytes for BYTES, raw uint16 for BF16), or a `device.DeviceArray` for a
    tensor in GPU memory."""

    # (also built without __init__, by requests_by_columns and python_plain: a new field goes there too)
    __slots__ = ("name", "datatype", "array")

    def __init__(self, name: str, datatype: str, array: np.ndarray) -> None:
        self.name = name
        self.datatype = datatype
        self.array = array


class Request:
    # (also built without __init__, by requests_by_columns: a new field goes there too)
    __slots__ = (
        "request_id", "id", "inputs", "requested_outputs", "parameters", "correlation_id", "flags",
        "timeout_us", "_cancelled", "device_outputs", "trace",
    )

    def __init__(
        self,
        request_id: int,
        id: str,
        inputs: list[Tensor],
        requested_outputs: list[str],
        parameters: str = "{}",
        correlation_id: Any = 0,
        flags: int = 0,
        timeout_us: int = 0,
        cancelled: Optional[Callable[[int], bool]] = None,
    ) -> None:
        self.request_id = request_id
        self.id = id
        self.inputs = inputs
        self.requested_outputs = requested_outputs
        self.parameters = parameters
        self.correlation_id = correlation_id
        self.flags = flags
        self.timeout_us = timeout_us
        self._cancelled = cancelled
        # set when the consumer of this request's outputs is another worker (BLS, an ensemble step):
        # device outputs may then stay on the GPU and go by CUDA IPC handle
        self.device_outputs = False
        self.trace = ""  # the supervisor's trace id while this request is traced

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled(self.request_id))


class PlainRequests(list):  # type: ignore[type-arg]
    """The requests of a batch whose fields other than request_id, id, inputs, requested_outputs and the
    cancellation probe are all at their defaults (`requests_by_columns` makes them): a backend may leave
    those fields unread. A list of Requests like any other."""

    __slots__ = ()


def requests_by_columns(request_ids: list[int], ids: Iterable[str],
                        columns: list[tuple[str, str, list[np.ndarray]]], wanted: list[str],
                        cancelled: Optional[Callable[[int], bool]]) -> list[Request]:
    """The requests of a batch sent by columns, as a PlainRequests: request i is `Request(request_ids[i],
    ids[i], inputs, wanted, cancelled=cancelled)`, every other field at its default, its inputs
    `Tensor(name, datatype, rows[i])` per column (name, datatype, rows). Built in one loop without an
    __init__ call per object (a batch of 32 is 64 objects or more); tests/unit/worker/test_batch_fast_paths.py
    holds the objects to what __init__ makes, so a new field of Request or Tensor fails there until it is
    set here too."""
    new = object.__new__
    out: list[Request] = PlainRequests()
    append = out.append
    if len(columns) == 1:  # what most models take
        (name, datatype, rows), = columns
        per_request: Iterable[Any] = rows
    else:
        per_request = [[] for _ in request_ids]
        for name, datatype, rows in columns:
            for inputs, row in zip(per_request, rows):
                tensor = new(Tensor)
                tensor.name = name
                tensor.datatype = datatype
                tensor.array = row
                inputs.append(tensor)
    one = len(columns) == 1
    for request_id, id, item in zip(request_ids, ids, per_request):
        if one:
            tensor = new(Tensor)
            tensor.name = name
            tensor.datatype = datatype
            tensor.array = item
            item = [tensor]
        request = new(Request)
        request.request_id = request_id
        request.id = id
        request.inputs = item
        request.requested_outputs = wanted
        request.parameters = "{}"
        request.correlation_id = 0
        request.flags = 0
        request.timeout_us = 0
        request._cancelled = cancelled
        request.device_outputs = False
        request.trace = ""
        append(request)
    return out


class Response:
    # (also built without __init__, by python_plain: a new field goes there too)
    __slots__ = ("outputs", "error", "parameters")

    def __init__(
        self,
        outputs: Optional[list[Tensor]] = None,
        error: Optional[InferdError] = None,
        parameters: Optional[dict[str, Any]] = None,
    ) -> None:
        self.outputs = outputs if outputs is not None else []
        self.error = error
        self.parameters = parameters if parameters is not None else {}


class AlikeResults(Sequence[Response]):
    """What `Backend.execute` may return for a batch whose every request got one output of the same name
    and datatype, as numpy arrays of one shape and dtype, without error or parameters: the arrays in request
    order, which columns.output_columns sends as one column without a Response per request. Read any other
    way, it is the list of those Responses (`Response([Tensor(name, datatype, array)])` each), built once on
    first use."""

    __slots__ = ("name", "datatype", "arrays", "_responses")

    def __init__(self, name: str, datatype: str, arrays: list[Any]) -> None:
        self.name = name
        self.datatype = datatype
        self.arrays = arrays
        self._responses: Optional[list[Response]] = None

    def responses(self) -> list[Response]:
        responses = self._responses
        if responses is None:
            name, datatype = self.name, self.datatype
            responses = self._responses = [Response([Tensor(name, datatype, a)]) for a in self.arrays]
        return responses

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, index: Any) -> Any:
        return self.responses()[index]

    def __iter__(self) -> Iterator[Response]:
        return iter(self.responses())


# emit(request, response, final): one response of a decoupled request (None: a flag-only final)
Emit = Callable[["Request", Optional["Response"], bool], None]


class WorkerContext:
    """What the runtime lends a backend: logging verbosity, the cancellation probe, `poll`, to be
    called from the main thread while it waits on model code running elsewhere (e.g. an async
    execute on an event-loop thread) so that Cancel messages are still picked up, and `emit`, which
    sends one response of a decoupled request to the supervisor at once (callable from any thread); a thread
    that emits many at once may hold them for one write (`hold_emits`, `release_emits`)."""

    def __init__(
        self,
        log_verbose: int = 0,
        cancelled: Optional[Callable[[int], bool]] = None,
        poll: Optional[Callable[[], None]] = None,
        emit: Optional[Emit] = None,
        hold_emits: Optional[Callable[[], None]] = None,
        release_emits: Optional[Callable[[], None]] = None,
    ) -> None:
        self.log_verbose = log_verbose
        self.cancelled = cancelled
        self.poll = poll
        self.emit = emit
        # the calling thread's emits wait for release_emits(), then leave in one write (Outbox.hold)
        self.hold_emits = hold_emits
        self.release_emits = release_emits


class Backend(Protocol):
    name: str
    # capability flags
    supports_auto_complete: bool
    supports_decoupled: bool
    # outputs checked against the configuration (datatype, shape) as Triton's framework backends do;
    # False: passed as the model returned them (the Python backend); absent means True
    checks_outputs: bool

    def auto_complete(self, model: ModelSpec, config: dict[str, Any]) -> dict[str, Any]:
        """Return the completed config (dict); raise InferdError on failure."""
        ...

    def load(self, model: ModelSpec, context: WorkerContext) -> None:
        """Import / build the model and run its initialization; raise InferdError on failure."""
        ...

    def execute(self, requests: list[Request]) -> Sequence[Response]:
        """One Response per Request, same order (a list, or AlikeResults). Never raises for model errors:
        they become per-request errors (a backend bug may still raise; the runtime then fails the batch).
        Decoupled models (`supports_decoupled`): responses go out through `WorkerContext.emit`;
        the returned Response of a request is empty while it streams on, or carries the error
        that ends a request which has not sent its final response."""
        ...

    def unload(self) -> Optional[InferdError]:
        """Run the model's finalization; return (not raise) an error it reported."""
        ...

    # optional: `readiness_check() -> Optional[Callable[[], bool]]`, after load: the model's own readiness
    # check (a Python model's is_ready()), which raises or returns its bool; None or absent: there is none
