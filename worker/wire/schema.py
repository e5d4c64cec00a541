"""The messages between the supervisor and a worker: one dataclass per message, tagged by MESSAGE_TYPES.

docs/worker-protocol.md is the contract; wire.codec turns these into frames and back. Runs on Python
3.9+ (worker environments), so no `match`, no slots=, no `X | Y` at runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

WIRE_VERSION = 8  # 2: MetricsReport (custom metrics of Python models); 3: ExecuteColumns, ExecuteResultColumns;
# 4: TensorRef loc "cuda" (device, owner), RequestItem/BlsRequest.device_outputs, ReleaseOutputs.device;
# 5: LogSettings; 6: Execute/ExecuteColumns.poll_us; 7: MetricsReport.ack, MetricsAck;
# 8: LoadResult.readiness, ReadinessProbe / ReadinessResult, LoadModel/AutoComplete.backend_dir; Attach (added
# without a bump: the core and its workers come from one install, and no existing message changed)

# Tensors at or below this many bytes ride as ZeroMQ frames; larger ones go through shared memory.
INLINE_MAX_BYTES = 64 * 1024

# Data frames at least this big are sent zero-copy (ZeroMQ keeps a reference to the buffer); smaller
# ones, and every header, are copied into the message: for small frames a copy is cheaper than the
# Frame object and reference tracking a zero-copy send needs.
ZERO_COPY_MIN_BYTES = 64 * 1024


@dataclass
class TensorRef:
    """Where a tensor's bytes are: `loc` is "frame" (index into the message frames), "shm" (POSIX
    shared memory `region`) or "cuda": device memory on GPU `device`, inside the allocation exported
    by the cudaIpcMemHandle hex-encoded in `region`, at `offset`, `nbytes` long, kept alive by `owner`
    (a producer worker's instance name, or "client:<region name>" for a client's CUDA shm region)."""

    name: str
    datatype: str
    shape: list[int]
    loc: str = "frame"
    frame: int = -1
    region: str = ""
    offset: int = 0
    nbytes: int = 0
    device: int = 0
    owner: str = ""


@dataclass
class WireError:
    code: int  # ErrorCode value
    message: str


@dataclass
class RequestItem:
    """One inference request inside an Execute batch (its inputs, as the model will see them)."""

    request_id: int  # supervisor-internal id, unique per worker connection
    id: str  # the client's request id
    inputs: list[TensorRef]
    requested_outputs: list[str]
    parameters: str = "{}"  # JSON object of custom request parameters (pb_utils request.parameters())
    correlation_id: Any = 0  # int or str
    flags: int = 0  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START=1, _END=2
    timeout_us: int = 0
    device_outputs: bool = False  # another worker consumes the outputs: device outputs may stay on the GPU
    trace: str = ""  # the supervisor's trace of this request, while traced (pb_utils request.trace())


@dataclass
class ResponseItem:
    request_id: int
    outputs: list[TensorRef] = field(default_factory=list)
    error: Optional[WireError] = None
    parameters: dict[str, Any] = field(default_factory=dict)


# ---- worker -> supervisor -------------------------------------------------------------------


@dataclass
class Hello:
    wire_version: int
    pid: int
    instance_name: str
    python_version: str
    numpy_version: str
    zmq_version: str


@dataclass
class AutoCompleteResult:
    config_json: str = ""
    error: Optional[WireError] = None


@dataclass
class LoadResult:
    error: Optional[WireError] = None
    backend: str = ""  # backend that loaded the model
    # the model defines is_ready() (python_backend after 2.51): the worker answers ReadinessProbes on its
    # "<identity>/ready" socket, opened before this LoadResult left
    readiness: bool = False


@dataclass
class ExecuteResult:
    batch_id: int
    responses: list[ResponseItem]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # set when the worker ran this batch merged with others in one execute() (direct peers): in the reply that
    # counts the execution, its batch items in all; -1 in the others; 0 (left out): this batch alone
    merged: int = 0


@dataclass
class TensorColumn:
    """One tensor of every request of a batch sent by columns: data frame `frame` holds the requests'
    tensors of `shape` back to back, in request order."""

    name: str
    datatype: str  # numeric (not BYTES): every request's tensor has the same byte size
    shape: list[int]
    frame: int


@dataclass
class ExecuteResultColumns:
    """An ExecuteResult of requests answered alike, sent output by output: every request succeeded,
    without response parameters, with the same outputs (name, datatype, shape; numeric, inline). It
    costs a few objects per batch to write and read instead of a few per request."""

    batch_id: int
    request_ids: list[int]
    outputs: list[TensorColumn]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    merged: int = 0  # as ExecuteResult.merged


@dataclass
class StreamResponse:
    """One response of a decoupled request, sent as soon as the model produces it (any thread).
    `response` None is a flag-only FINAL; output frames follow the header as for ExecuteResult.
    The request ends with the first message whose `final` is true (or an error for it in the
    ExecuteResult of its batch, when execute failed before FINAL)."""

    request_id: int
    final: bool = False
    response: Optional[ResponseItem] = None


@dataclass
class Log:
    level: str  # INFO, WARNING, ERROR, VERBOSE
    message: str


@dataclass
class Bye:
    """Sent after finalize() on Shutdown, just before the worker exits 0."""

    error: Optional[WireError] = None


# ---- supervisor -> worker -------------------------------------------------------------------


@dataclass
class AutoComplete:
    """Run the backend's auto-complete on a config (JSON, Triton rendering) and return it."""

    model_name: str
    model_dir: str  # <repo>/<model>
    version: str
    config_json: str
    backend: str
    backend_dir: str = ""  # as LoadModel's


@dataclass
class LoadModel:
    model_name: str
    model_dir: str
    version: str
    config_json: str  # normalised config, Triton JSON rendering (args['model_config'])
    backend: str
    instance_name: str  # <group>_<k>
    instance_kind: str  # CPU / GPU / MODEL
    device_id: int = 0
    # a Python-based backend's directory (<backend dir>/<name>): its model.py is the model's code, run by the
    # python backend (python_backend README, "Python-based Backends"); "" for every other model
    backend_dir: str = ""


@dataclass
class Execute:
    batch_id: int
    requests: list[RequestItem]
    # shm regions the supervisor has unlinked since the last Execute: unmap them if cached
    forget_regions: list[str] = field(default_factory=list)
    # > 0: once this batch is answered, poll for the next message for up to this many µs instead of sleeping
    # (the supervisor polls too: requests come one at a time; supervisor/core/busy_poll.py)
    poll_us: int = 0


@dataclass
class ExecuteColumns:
    """An Execute of requests that differ only in their tensor bytes and client ids, sent input by
    input: the same inputs (name, datatype, shape; numeric, inline), the same requested outputs, and
    default parameters, sequence fields and timeout. `ids` is empty when every client id is empty."""

    batch_id: int
    request_ids: list[int]
    inputs: list[TensorColumn]
    ids: list[str] = field(default_factory=list)
    requested_outputs: list[str] = field(default_factory=list)
    forget_regions: list[str] = field(default_factory=list)
    poll_us: int = 0  # as Execute's


@dataclass
class Cancel:
    request_ids: list[int]


@dataclass
class ReleaseOutputs:
    """Output regions of this worker (TensorRef loc "shm" in results) the supervisor no longer uses,
    and device outputs (loc "cuda", by key "<region>:<offset>") every holder has released."""

    regions: list[str]
    device: list[str] = field(default_factory=list)


@dataclass
class Shutdown:
    pass


@dataclass
class LogSettings:
    """The server's log settings for model logging (pb_utils.Logger): sent before LoadModel and again
    after every change (POST /v2/logging); the worker applies them when its main thread reads them."""

    verbose: int = 0
    info: bool = True
    warning: bool = True
    errors: bool = True  # log_error ("error" names a WireError field in every message)


@dataclass
class Attach:
    """Connect one more DEALER, with the main socket's identity, to `endpoint` ("ipc://<path>": a frontend
    process's ROUTER) and accept Execute / ExecuteColumns / Cancel / ReleaseOutputs from it as well,
    answering there (docs/worker-protocol.md, "Direct peers"). Nothing is sent back on the main socket."""

    endpoint: str


# ---- BLS (worker <-> supervisor on the worker's "<identity>/bls" socket) ---------------------------


@dataclass
class BlsRequest:
    """A Python model's request to another model (pb_utils.InferenceRequest.exec / async_exec)."""

    call_id: int
    model_name: str
    model_version: str
    request_id: str
    inputs: list[TensorRef]  # frames, or shm regions owned by the calling worker
    requested_outputs: list[str]
    correlation_id: Any = 0
    flags: int = 0
    timeout_us: int = 0
    parameters: str = "{}"
    decoupled: bool = False  # exec(decoupled=True): any number of BlsResponses, the last one final
    device_outputs: bool = False  # the caller can open device tensors (CUDA IPC): outputs may stay on the GPU
    trace: str = ""  # InferenceRequest(trace=request.trace()): the caller's trace, which this call continues


@dataclass
class BlsResponse:
    call_id: int
    outputs: list[TensorRef] = field(default_factory=list)
    leases: list[int] = field(default_factory=list)  # per output: supervisor lease id (0: a frame)
    error: Optional[WireError] = None
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True


@dataclass
class BlsCancel:
    call_id: int


@dataclass
class BlsRelease:
    """Leases of BLS outputs the model no longer references (their arrays were garbage collected)."""

    lease_ids: list[int]


@dataclass
class ModelControl:
    """pb_utils.load_model / unload_model / is_model_ready; `files` names the data frames that follow."""

    call_id: int
    op: str  # "load" | "unload" | "ready"
    model_name: str
    model_version: str = ""
    config: str = ""
    files: list[str] = field(default_factory=list)
    unload_dependents: bool = False


@dataclass
class ModelControlResult:
    call_id: int
    error: Optional[WireError] = None
    ready: bool = False


# ---- custom metrics (worker -> supervisor on the worker's "<identity>/metrics" socket) -------------


@dataclass
class MetricsReport:
    """A worker's custom metrics (pb_utils.MetricFamily / Metric), sent by its heartbeat thread at most
    once per heartbeat interval and only when something changed (wire.metric_rules has the rules).

    `full`: every live family and metric is listed (whatever the supervisor had from this worker and is
    not listed is gone); otherwise only what is new or changed since the previous report. Ids are the
    worker's own, never reused. families: [fid, name, description, kind]; metrics: [mid, fid, labels
    {name: value}, buckets or null]; values, cumulative since the metric was created: [mid, total]
    (counter); [mid, set_value, sets, incs, incs_at_set, set_ns] (gauge: the last set()'s value, how many
    set() calls, the sum of all increments and that sum at the last set(), whose time is set_ns on
    CLOCK_MONOTONIC, which every process of the host shares); [mid, sum, n_0, ..., n_k] (histogram:
    observations per bucket, the last one +Inf); dropped: families whose MetricFamily object was garbage
    collected (their metrics go with them)."""

    full: bool = False
    source: str = ""  # "model 'm' instance 'm_0'", for the supervisor's warnings
    families: list[Any] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    ack: int = 0  # > 0: answer with MetricsAck(ack) once applied (a metric call waits for it, as in Triton)


@dataclass
class MetricsAck:
    """The supervisor applied the MetricsReport that asked with `ack` = seq (on the worker's metrics socket):
    a pb_utils metric call returns only then, so a /metrics scrape made after it shows the change."""

    seq: int = 0


# ---- user readiness (the worker's "<identity>/ready" socket, only for models defining is_ready()) ----


@dataclass
class ReadinessProbe:
    """supervisor -> worker: call the model's is_ready() (a readiness request for its model). One at a time
    per worker; `seq` > 0 is echoed in the answer."""

    seq: int = 0


@dataclass
class ReadinessResult:
    """worker -> supervisor: is_ready()'s answer to probe `seq` (`error`: it raised or returned no bool).
    seq 0: the socket's first message, sent as it opens (the supervisor knows then it can probe)."""

    seq: int = 0
    ready: bool = False
    error: Optional[WireError] = None


# ---- both ways ------------------------------------------------------------------------------


@dataclass
class Heartbeat:
    seq: int = 0


MESSAGE_TYPES: dict[str, type[Any]] = {
    "hello": Hello,
    "autocomplete_result": AutoCompleteResult,
    "load_result": LoadResult,
    "execute_result": ExecuteResult,
    "execute_result_columns": ExecuteResultColumns,
    "stream_response": StreamResponse,
    "log": Log,
    "bye": Bye,
    "autocomplete": AutoComplete,
    "load_model": LoadModel,
    "execute": Execute,
    "execute_columns": ExecuteColumns,
    "cancel": Cancel,
    "release_outputs": ReleaseOutputs,
    "shutdown": Shutdown,
    "log_settings": LogSettings,
    "heartbeat": Heartbeat,
    "bls_request": BlsRequest,
    "bls_response": BlsResponse,
    "bls_cancel": BlsCancel,
    "bls_release": BlsRelease,
    "model_control": ModelControl,
    "model_control_result": ModelControlResult,
    "metrics_report": MetricsReport,
    "metrics_ack": MetricsAck,
    "readiness_probe": ReadinessProbe,
    "readiness_result": ReadinessResult,
    "attach": Attach,  # (last: the fuzz targets pick classes by their position in this table)
}
TAGS: dict[type[Any], str] = {cls: tag for tag, cls in MESSAGE_TYPES.items()}
