"""The frontend <-> core link's frames and the one codec of what they carry.

A frame is `u32 length | u8 kind | u32 call id | u32 header length | header (JSON) | data`, the length
counting what follows it. Kinds are typed (Kind); the header is a JSON document whose shape the kind
fixes; `data` holds the bytes of the tensors that ride inline, each at the (offset, size) its header
entry names. Inputs larger than INLINE_MAX_BYTES never ride here: the frontend writes them into a
shared-memory region of its own and sends the region's handle (loc "s"), which the core hands on to
the worker unchanged (Tensor.shm_ref), so their bytes are never copied by the core. Large outputs a
worker wrote into its own region go to the frontend by that region's handle the same way; the core
holds the response (and so the region) until the frontend sends RELEASE for the call.
"""

from __future__ import annotations

import base64
import enum
import struct
import time
from typing import Any

import orjson
from inferd.worker.wire.errors import ErrorCode, InferdError
from inferd.worker.wire.messages import INLINE_MAX_BYTES

from ..inference.types import InferRequest, InferResponse, RequestedOutput, Tensor

HEAD = struct.Struct("<IBII")  # length (of what follows the u32), kind, call id, header length
PREFIX = 4
MAX_HEADER_BYTES = 16 * 1024 * 1024  # a header beyond this is a broken peer


class Kind(enum.IntEnum):
    # frontend -> core
    HELLO = 1  # header {"pid"}
    INFER = 2  # an InferRequest; answered by RESULT or ERROR with the same call id
    STREAM = 3  # an InferRequest on a stream; answered by STREAM_ITEMs, the last one final
    CANCEL = 4  # the frontend gave up on call id
    CONTROL = 5  # header {"op": Op, "args": [...]}; answered by CONTROL_RESULT or ERROR
    SNAPSHOT_ACK = 6  # header {"version"}: that snapshot is applied
    RELEASE = 7  # the outputs a RESULT of call id sent by handle are no longer read
    PONG = 8  # the answer to a PING
    SERVING = 9  # the frontend's HTTP and gRPC servers listen
    STATS = 10  # header [rows]: statistics of direct requests (stats_relay.py); call id: the STATS_PULL answered, or 0
    # core -> frontend
    SNAPSHOT = 20  # header: snapshot.Snapshot document
    RESULT = 21  # an InferResponse (large outputs by their worker region's handle: RELEASE them)
    STREAM_ITEM = 22  # header {"final", "error"?: [code, message], "response"?: response header}
    CONTROL_RESULT = 23  # header {"value"}
    ERROR = 24  # header {"code", "message"}
    PING = 25  # liveness (watchdog.py): answered by PONG
    STATS_PULL = 26  # send what statistics you hold now: answered by STATS with the same call id


class Op(enum.IntEnum):
    """Control calls a frontend makes to the core (DataPlane methods whose answer lives there)."""

    STATISTICS = 1
    STATUS = 2
    REPOSITORY_INDEX = 3
    LOAD = 4
    UNLOAD = 5
    SHM_STATUS = 6
    SHM_REGISTER = 7
    SHM_UNREGISTER = 8
    TRACE_SETTINGS = 9
    LOG_SETTINGS = 10
    MODEL_READY = 11  # a model whose readiness asks its is_ready() (snapshot "asks"): the core asks it
    READY = 12  # server readiness while such a model is loaded under --strict-readiness
    RESTART = 14  # infer-ctl restart: the core replaces the model's workers (core/restart.py)
    LOAD_REPORT = 13  # a generate request's endpoint-load-metrics header (http_api/orca.py): the core's custom metrics


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    raise TypeError("not serializable on the frontend link: %s" % type(value).__name__)


def dumps(doc: Any) -> bytes:
    try:
        return orjson.dumps(doc, default=_default)
    except TypeError as exc:
        raise InferdError(ErrorCode.INVALID_ARG, str(exc)) from None


def _revive(value: Any) -> Any:
    """Bytes sent as {"__bytes__": base64} back to bytes (load parameters "file:..."), recursively."""
    if isinstance(value, dict):
        if len(value) == 1 and "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        return {k: _revive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_revive(v) for v in value]
    return value


def loads(raw: Any) -> Any:
    return orjson.loads(raw)


def loads_revived(raw: Any) -> Any:
    return _revive(orjson.loads(raw))


def frame(kind: int, call: int, header: bytes, data_size: int = 0) -> bytes:
    """The frame's head and header; `data_size` bytes of data must follow it on the stream."""
    return HEAD.pack(HEAD.size - PREFIX + len(header) + data_size, kind, call, len(header)) + header


def error_header(exc: InferdError) -> bytes:
    return orjson.dumps({"code": int(exc.code), "message": exc.message})


def error_of(header: dict[str, Any]) -> InferdError:
    return InferdError(ErrorCode(int(header.get("code", 0))), str(header.get("message", "")))


# ---------------------------------------------------------------- tensors


def _nbytes(data: Any) -> int:
    return data.nbytes if type(data) is memoryview else memoryview(data).nbytes


def _tensor_docs(tensors: list[Tensor], by_handle: bool) -> tuple[list[Any], list[Any], int, bool]:
    """Header entries of `tensors`, the data chunks behind them, their size, and whether any went by
    handle. With `by_handle`, a tensor larger than INLINE_MAX_BYTES with `shm_ref` goes by handle
    ("s", region, offset, size); any other inline ("b", offset, size). On every request's path: kept tight."""
    docs: list[Any] = []
    chunks: list[Any] = []
    offset = 0
    handles = False
    for t in tensors:
        data = t.data
        nbytes = data.nbytes if type(data) is memoryview else memoryview(data).nbytes
        if by_handle and nbytes > INLINE_MAX_BYTES and t.shm_ref is not None:
            loc: list[Any] = ["s", t.shm_ref[0], t.shm_ref[1], nbytes]
            handles = True
        else:
            loc = ["b", offset, nbytes]
            if nbytes:
                chunks.append(data)
                offset += nbytes
        docs.append([t.name, t.datatype, t.shape, t.parameters or None, loc])
    return docs, chunks, offset, handles


def _tensors(docs: list[Any], data: memoryview, attach: Any) -> list[Tensor]:
    out: list[Tensor] = []
    append = out.append
    end = len(data)
    for name, datatype, shape, params, loc in docs:
        if loc[0] == "b":
            start = loc[1]
            stop = start + loc[2]
            if start < 0 or stop < start or stop > end or type(stop) is not int:
                raise InferdError(ErrorCode.INTERNAL, "tensor '%s' lies outside its frame" % name)
            append(Tensor(name, datatype, shape, data[start:stop], params or {}))
        else:
            if loc[0] != "s" or attach is None:
                raise InferdError(ErrorCode.INTERNAL, "a tensor by shared-memory handle where none is expected")
            view = attach(loc[1], int(loc[2]), int(loc[3]))
            append(Tensor(name, datatype, shape, view, params or {}, (loc[1], int(loc[2]))))
    return out


# ---------------------------------------------------------------- requests and responses


def request_parts(req: InferRequest) -> tuple[bytes, list[Any], int]:
    """(header, data chunks, data size) of a request."""
    docs, chunks, size, _ = _tensor_docs(req.inputs, True)
    head: dict[str, Any] = {"m": req.model_name, "v": req.model_version, "in": docs, "a": req.arrival_ns}
    if req.id:
        head["i"] = req.id
    if req.outputs:
        head["o"] = [[o.name, o.parameters or None] for o in req.outputs]
    if req.parameters:
        head["p"] = req.parameters
    if req.correlation_id:
        head["c"] = req.correlation_id
    if req.flags:
        head["f"] = req.flags
    if req.priority:
        head["pr"] = req.priority
    if req.timeout_us:
        head["t"] = req.timeout_us
    if isinstance(req.trace_parent, str):
        head["tp"] = req.trace_parent
    if req.shm_hold is not None:  # the client shm regions it names: the core holds them too (core_link)
        head["sh"] = list(req.shm_hold.names)
    return dumps(head), chunks, size


_REQUEST_KEYS = frozenset(("m", "v", "in", "a"))


def decode_request(header: Any, data: memoryview, attach: Any) -> InferRequest:
    h = loads(header)
    inputs = _tensors(h["in"], data, attach)
    arrival = h.get("a") or time.monotonic_ns()
    if type(arrival) is not int:
        arrival = int(arrival)
    if h.keys() <= _REQUEST_KEYS:  # the common request: no id, outputs, parameters, sequence or priority
        return InferRequest(h["m"], h.get("v", ""), "", inputs, [], {}, 0, 0, 0, 0, arrival)
    req = InferRequest(h["m"], h.get("v", ""), h.get("i", ""), inputs,
                       [RequestedOutput(name, params or {}) for name, params in h.get("o", ())],
                       h.get("p") or {}, h.get("c", 0), h.get("f", 0), h.get("pr", 0), h.get("t", 0), arrival)
    tp = h.get("tp")
    if tp is not None:
        req.trace_parent = tp
    sh = h.get("sh")
    if isinstance(sh, list):  # region names (core_link turns them into the core's hold)
        req.shm_hold = tuple(n for n in sh if isinstance(n, str))
    return req


def response_parts(resp: InferResponse, by_handle: bool = False) -> tuple[dict[str, Any], list[Any], int]:
    """With `by_handle`, a large output in a worker's region goes by that region's handle: the caller
    keeps the response (and so the region) until the frontend sends RELEASE for the call."""
    head, chunks, size, _ = result_parts(resp, by_handle)
    return head, chunks, size


def result_parts(resp: InferResponse, by_handle: bool) -> tuple[dict[str, Any], list[Any], int, bool]:
    """response_parts, and whether any output went by handle (then the response must be held)."""
    docs, chunks, size, handles = _tensor_docs(resp.outputs, by_handle)
    head: dict[str, Any] = {"m": resp.model_name, "v": resp.model_version, "o": docs}
    if resp.id:
        head["i"] = resp.id
    if resp.parameters:
        head["p"] = resp.parameters
    return head, chunks, size, handles


def by_handle(h: dict[str, Any]) -> bool:
    """Whether a response header refers to a region (then its call must be released)."""
    for doc in h["o"]:  # noqa: SIM110  (a loop, not any(generator): this runs for every response)
        if doc[4][0] == "s":
            return True
    return False


def decode_response(h: dict[str, Any], data: memoryview, attach: Any = None) -> InferResponse:
    return InferResponse(h["m"], h["v"], h.get("i", ""), _tensors(h["o"], data, attach), h.get("p") or {})
