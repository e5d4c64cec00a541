"""A worker's answers as core responses: an ExecuteResult / ExecuteResultColumns (`batch_result`) or a
StreamResponse (`stream_response`), decoded by wire.codec (`decode`, its JSON parsed by orjson), become
InferResponses (or the errors they carry) whose output tensors are views of the data frames, of the
worker's own regions (outputs.WorkerOutputs) or shares of its device memory. Every value the worker
sent is checked as it is used: nonsense is a KeyError/TypeError/ValueError/AttributeError, and the
caller kills that worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from inferd.supervisor.inference.tensors import element_count
from inferd.supervisor.inference.types import FirstResponseError, InferRequest, InferResponse, Tensor
from inferd.worker.wire import messages as m
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError


def decode(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """(message, data frames) of what a worker sent; wire.messages.ProtocolError on anything malformed.
    (wire.codec.decode with orjson, which takes the channel's memoryviews as they are.)"""
    if not frames:
        raise m.ProtocolError("empty message")
    return _decode_header(frames[0], _loads), frames[1:]


_decode_header = m.decode_header
_orjson_loads = orjson.loads


def _loads(raw: Any) -> Any:
    """orjson.loads, else json's reading where orjson refuses what json reads (a string holding a lone
    surrogate, as a worker's json writes one from a model's log line or error message; NaN): the worker
    writes with json, so nothing it writes is refused here (fuzz/targets/wire_codec.py)."""
    try:
        return _orjson_loads(raw)
    except ValueError:
        return m.json_loads(bytes(raw))


_columns_message = m.decode_execute_result_columns
_new = object.__new__

# An ExecuteResult in the shape the worker writes for every plain answer (wire.writers: every header field;
# items of request_id and outputs only; each output a reference into a data frame)
_PLAIN_HEADER = frozenset(("batch_id", "responses", "compute_input_ns", "compute_infer_ns", "compute_output_ns",
                           "t"))
_PLAIN_ITEM = frozenset(("request_id", "outputs"))
_FRAME_REF = frozenset(("name", "datatype", "shape", "frame", "offset", "nbytes"))


class PlainResult:
    """An ExecuteResult of that plain shape kept as its parsed JSON (`read`): `batch_result` turns it into
    responses in one pass, without the wire's message objects in between (the supervisor reads one per
    batch; this saves ~1.7 µs of its ~6 for a one-request batch)."""

    __slots__ = ("batch_id", "header")

    def __init__(self, header: dict[str, Any]) -> None:
        self.batch_id = header["batch_id"]
        self.header = header


def read(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """`decode`, except that a plain ExecuteResult comes as a PlainResult (for `batch_result`)."""
    if not frames:
        raise m.ProtocolError("empty message")
    raw = frames[0]
    try:
        header = _loads(raw)
    except (ValueError, RecursionError) as exc:  # (as wire.codec.decode_header words it)
        raise m.ProtocolError("malformed message: %s" % exc) from None
    if type(header) is dict:
        if header.keys() == _PLAIN_HEADER and header["t"] == "execute_result" and _plain_items(header["responses"]):
            return PlainResult(header), frames[1:]
        if header.get("t") == "execute_result_columns":  # (a batch answered alike: wire.codec's decoder, direct)
            message = _columns_message(header)
            if message is not None:
                return message, frames[1:]
            return _decode_header(raw, _loads), frames[1:]  # unchanged by it: decode names the problem
    # anything else as decode reads it, from the JSON parsed once (a fast decoder that gives up after
    # changing it parses the frame again)
    parsed = [header]
    return _decode_header(raw, lambda again: parsed.pop() if parsed else _loads(again)), frames[1:]


def _plain_items(items: Any) -> bool:
    if type(items) is not list:
        return False
    for item in items:
        if type(item) is not dict or item.keys() != _PLAIN_ITEM:
            return False
        refs = item["outputs"]
        if type(refs) is not list:
            return False
        for ref in refs:
            if type(ref) is not dict or ref.keys() != _FRAME_REF:
                return False
    return True


@dataclass(slots=True)
class BatchResult:
    """What one Execute returned: a response or an error per request (same order), and compute times."""

    responses: list[InferResponse | InferdError]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # the worker merged this batch with others in one execute(): the batch items that execution counts, in the
    # result that counts it, 0 in the others; None: this batch ran alone (scheduler/outcomes.executed_items)
    execution_items: int | None = None


def shm_output(name: str, datatype: str, shape: list[int], region: Any, offset: Any, nbytes: Any,
               outputs: Any) -> Tensor:
    """An output the worker wrote into its own region (worker/arena.py): a view of its mapping, passed on
    by handle (`shm_ref`). ValueError for a bad reference or a worker that may not send one."""
    if outputs is None or type(region) is not str or type(offset) is not int or type(nbytes) is not int:
        raise ValueError(f"output '{name}' has a bad reference")
    return Tensor(name, datatype, shape, outputs.view(region, offset, nbytes), shm_ref=(region, offset))


def device_output(req: InferRequest, ref: m.TensorRef, outputs: Any) -> Tensor:
    """A device output kept on the worker's GPU, as a Tensor holding a share of it (no bytes here)."""
    if outputs is None:
        raise ValueError(f"output '{ref.name}' has a bad reference")
    return Tensor(ref.name, ref.datatype, list(ref.shape), b"", device_ref=outputs.device(ref.name, ref, req.inputs))


def _frame_output(name: str, datatype: str, shape: list[int], buffers: Sequence[Any], frame: Any, offset: Any,
                 nbytes: Any) -> Tensor:
    """An output at `offset` (`nbytes` long) of data frame `frame`, as a Tensor viewing it (small outputs share
    a frame; offset 0 with nbytes 0 is the whole frame). ValueError for a reference outside the frames."""
    if type(frame) is not int or not 0 <= frame < len(buffers):
        raise ValueError(f"output '{name}' has a bad reference")
    buf = buffers[frame]
    if not (offset == 0 and (nbytes == 0 or nbytes == len(buf))):
        if type(offset) is not int or type(nbytes) is not int or not 0 <= offset <= offset + nbytes <= len(buf):
            raise ValueError(f"output '{name}' lies outside its data frame")
        buf = buf[offset:offset + nbytes]
    return Tensor(name, datatype, shape, buf)


def _dead_device_input(req: InferRequest) -> InferdError | None:
    for t in req.inputs:
        if t.device_ref is not None and not t.device_ref.share.alive:
            try:
                t.device_ref.share.check()
            except InferdError as exc:
                return exc
    return None


def batch_result(requests: Sequence[InferRequest], ids: Sequence[int],
                 msg: m.ExecuteResult | m.ExecuteResultColumns | PlainResult, data: Sequence[Any], version: str,
                 outputs_in_shm: Any = None) -> BatchResult:
    """An ExecuteResult (or ExecuteResultColumns, or PlainResult) and its data frames as core responses;
    output tensors are views of the frames. KeyError/TypeError/ValueError/AttributeError when the worker
    sent nonsense."""
    if isinstance(msg, PlainResult):
        return _plain_result(requests, ids, msg.header, data, version)
    if type(msg) is m.ExecuteResultColumns:
        return _columns_result(requests, ids, msg, data, version)
    responses = msg.responses
    if len(responses) != len(requests):
        raise ValueError(f"{len(responses)} responses for {len(requests)} requests")
    buffers = data if type(data) is list else list(data)
    out: list[InferResponse | InferdError] = []
    for req, rid, item in zip(requests, ids, responses):  # lengths checked above
        if item.request_id != rid:
            raise ValueError("responses out of order")
        out.append(_response(req, item, buffers, version, outputs_in_shm))
    return BatchResult(out, int(msg.compute_input_ns), int(msg.compute_infer_ns), int(msg.compute_output_ns),
                       _merged(msg.merged))


def _merged(merged: int) -> int | None:
    return None if not merged else max(0, int(merged))


def _plain_result(requests: Sequence[InferRequest], ids: Sequence[int], header: dict[str, Any],
                  data: Sequence[Any], version: str) -> BatchResult:
    """`batch_result` of a PlainResult: `_response`'s checks, read from the JSON as it was parsed."""
    items = header["responses"]
    if len(items) != len(requests):
        raise ValueError(f"{len(items)} responses for {len(requests)} requests")
    buffers = data if type(data) is list else list(data)
    out: list[InferResponse | InferdError] = []
    for req, rid, item in zip(requests, ids, items):  # lengths checked above
        if item["request_id"] != rid:
            raise ValueError("responses out of order")
        outputs = [_frame_output(ref["name"], ref["datatype"], ref["shape"], buffers, ref["frame"], ref["offset"],
                                ref["nbytes"]) for ref in item["outputs"]]
        gone = _dead_device_input(req)
        out.append(gone if gone is not None else
                   InferResponse(req.model_name, version or req.model_version, req.id, outputs, {}))
    return BatchResult(out, int(header["compute_input_ns"]), int(header["compute_infer_ns"]),
                       int(header["compute_output_ns"]))


def _response(req: InferRequest, item: m.ResponseItem, buffers: Sequence[Any], version: str,
              outputs_in_shm: Any) -> InferResponse | InferdError:
    """One ResponseItem as a core response, or the error it carries (with the response beside it when the
    item has outputs too: FirstResponseError)."""
    err = item.error
    if err is not None:
        try:
            code = ErrorCode(err.code)
        except ValueError:
            code = ErrorCode.INTERNAL
        if not item.outputs:
            return InferdError(code, str(err.message))
        first = _response(req, m.ResponseItem(item.request_id, item.outputs, None, item.parameters), buffers,
                          version, outputs_in_shm)
        if isinstance(first, InferdError):
            return first
        return FirstResponseError(code, str(err.message), first)
    outputs = []
    for ref in item.outputs:
        loc = ref.loc
        if loc == "frame":
            outputs.append(_frame_output(ref.name, ref.datatype, ref.shape, buffers, ref.frame, ref.offset,
                                        ref.nbytes))
        elif loc == "shm":
            outputs.append(shm_output(ref.name, ref.datatype, ref.shape, ref.region, ref.offset, ref.nbytes,
                                      outputs_in_shm))
        elif loc == "cuda":
            outputs.append(device_output(req, ref, outputs_in_shm))
        else:
            raise ValueError(f"output '{ref.name}' has a bad reference")
    gone = _dead_device_input(req)
    if gone is not None:  # an input lived in a worker that died meanwhile: the result cannot be trusted
        return gone  # (its own device outputs are released as `outputs` is dropped)
    params = item.parameters
    return InferResponse(req.model_name, version or req.model_version, req.id, outputs,
                         params if type(params) is dict else {})


def _columns_result(requests: Sequence[InferRequest], ids: Sequence[int], msg: m.ExecuteResultColumns,
                    data: Sequence[Any], version: str) -> BatchResult:
    """`batch_result` of an ExecuteResultColumns: request i's output is row i of its column's frame."""
    if msg.request_ids != list(ids):
        raise ValueError("responses out of order")
    count = len(requests)
    columns = []
    for column in msg.outputs:
        name, datatype, shape, frame = column.name, column.datatype, column.shape, column.frame
        dt = BY_NAME.get(datatype) if type(datatype) is str else None
        if type(name) is not str or dt is None or dt.itemsize == 0:
            raise ValueError(f"output column {name!r} has a bad datatype")
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"output column '{name}' has a bad shape")
        if type(frame) is not int or not 0 <= frame < len(data):
            raise ValueError(f"output column '{name}' has a bad reference")
        buf = data[frame]
        view = buf if type(buf) is memoryview and buf.format == "B" else memoryview(buf).cast("B")
        size = element_count(shape) * dt.itemsize
        if len(view) != count * size:
            raise ValueError(f"output column '{name}' does not hold {count} tensors of shape {shape}")
        columns.append((name, datatype, shape, view, size))
    out: list[InferResponse | InferdError] = []
    if len(columns) == 1:  # one output: what most models give; a loop without a comprehension per request
        (name, datatype, shape, view, size), = columns
        end = 0
        new = _new
        append = out.append
        # InferResponse(req.model_name, version or req.model_version, req.id, [Tensor(name, datatype,
        # shape[:], view[start:end])], {}), without the two __init__ calls per request; every field is set
        # (tests/unit/instances/test_columns.py holds these objects to the ones __init__ makes)
        for req in requests:
            start, end = end, end + size
            tensor = new(Tensor)
            tensor.name = name
            tensor.datatype = datatype
            tensor.shape = shape[:]
            tensor.data = view[start:end]
            tensor.parameters = {}
            tensor.shm_ref = None
            tensor.device_ref = None
            response = new(InferResponse)
            response.model_name = req.model_name
            response.model_version = version or req.model_version
            response.id = req.id
            response.outputs = [tensor]
            response.parameters = {}
            append(response)
    else:
        for i, req in enumerate(requests):
            outputs = [Tensor(name, datatype, list(shape), view[i * size:(i + 1) * size])
                       for name, datatype, shape, view, size in columns]
            out.append(InferResponse(req.model_name, version or req.model_version, req.id, outputs, {}))
    return BatchResult(out, int(msg.compute_input_ns), int(msg.compute_infer_ns), int(msg.compute_output_ns),
                       _merged(msg.merged))


def stream_response(req: InferRequest, msg: m.StreamResponse, data: Sequence[Any],
                    version: str, outputs_in_shm: Any = None) -> InferResponse | InferdError:
    """One StreamResponse as a core response (a flag-only final: a response without outputs) or
    the error it carries. ValueError when the worker sent nonsense."""
    item = msg.response
    if item is None:
        return InferResponse(req.model_name, version or req.model_version, req.id)
    return _response(req, item, list(data), version, outputs_in_shm)
