"""Hot-path framing of Execute / ExecuteColumns and ExecuteResult / ExecuteResultColumns, byte-compatible
with `wire.messages`.

`wire.messages.encode` goes through `dataclasses.asdict` (tens of µs per batch); here the Execute
header is built as plain dicts in the dataclasses' field order, fields at their default left out (the
worker's decoder fills them in), and serialized with orjson, and an
ExecuteResult header is read as plain dicts, checked as it is used. Every other message goes through
`wire.messages`. tests/unit/instances/test_codec.py pins the equivalence; test_columns.py holds the
by-columns forms to the request-by-request ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from inferd.supervisor.inference.tensors import element_count
from inferd.supervisor.inference.types import InferRequest, InferResponse, Tensor
from inferd.worker.wire import messages as m
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError


def tensor_ref(name: str, datatype: str, shape: Sequence[int], loc: str, frame: int, region: str,
               offset: int, nbytes: int, device: int = 0, owner: str = "") -> dict[str, Any]:
    if loc == "frame":  # loc "frame" and region "" are TensorRef's defaults: left out, less for the worker to parse
        return {"name": name, "datatype": datatype, "shape": list(shape), "frame": frame, "offset": offset,
                "nbytes": nbytes}
    ref = {"name": name, "datatype": datatype, "shape": list(shape), "loc": loc, "frame": frame,
           "region": region, "offset": offset, "nbytes": nbytes}
    if loc == "cuda":  # device and owner matter only for device memory (defaults 0 and "" otherwise)
        ref["device"] = device
        ref["owner"] = owner
    return ref


def request_item(request_id: int, req: InferRequest, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    item = {"request_id": request_id, "id": req.id, "inputs": inputs,
            "requested_outputs": [o.name for o in req.outputs]}
    # fields at RequestItem's defaults ("{}", 0, 0, 0) are left out: less for the worker to parse
    if req.parameters:
        item["parameters"] = json.dumps(req.parameters)
    cid = req.correlation_id
    if not (type(cid) is int and cid == 0):
        item["correlation_id"] = cid
    if req.flags:
        item["flags"] = req.flags
    if req.timeout_us:
        item["timeout_us"] = req.timeout_us
    if req.device_outputs:
        item["device_outputs"] = True
    if req.trace is not None:
        item["trace"] = str(req.trace.id)
    return item


def execute_header(batch_id: int, items: list[dict[str, Any]], forget: list[str]) -> bytes:
    return orjson.dumps({"batch_id": batch_id, "requests": items, "forget_regions": forget, "t": "execute"})


def execute_columns_header(batch_id: int, fields: dict[str, Any], forget: list[str]) -> bytes:
    """An ExecuteColumns header from `packing.Packed.columns`."""
    return orjson.dumps({"batch_id": batch_id, **fields, "forget_regions": forget, "t": "execute_columns"})


_RESULT_TAGS = frozenset(("execute_result", "execute_result_columns"))


def parse(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """(message, data frames). An ExecuteResult or ExecuteResultColumns stays a dict (with its tag "t");
    others are decoded by wire.messages. Raises wire.messages.ProtocolError on anything malformed."""
    if not frames:
        raise m.ProtocolError("empty message")
    try:
        header = orjson.loads(frames[0])
    except orjson.JSONDecodeError as exc:
        raise m.ProtocolError(f"malformed message: {exc}") from None
    if type(header) is dict and header.get("t") in _RESULT_TAGS:
        return header, frames[1:]
    return m.decode(frames)


@dataclass(slots=True)
class BatchResult:
    """What one Execute returned: a response or an error per request (same order), and compute times."""

    responses: list[InferResponse | InferdError]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


def output_buffer(name: Any, frame: Any, offset: Any, nbytes: Any, buffers: Sequence[memoryview]) -> memoryview:
    """The bytes of one output: `nbytes` at `offset` of data frame `frame` (the worker packs small
    outputs into one frame). ValueError when the reference lies outside the frames."""
    if type(frame) is not int or not 0 <= frame < len(buffers):
        raise ValueError(f"output '{name}' has a bad reference")
    buf = buffers[frame]
    if offset == 0 and (nbytes == 0 or nbytes == len(buf)):  # offset 0 + nbytes 0: the whole frame
        return buf
    if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 or offset + nbytes > len(buf):
        raise ValueError(f"output '{name}' lies outside its data frame")
    return buf[offset:offset + nbytes]


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


def _dead_device_input(req: InferRequest) -> InferdError | None:
    for t in req.inputs:
        if t.device_ref is not None and not t.device_ref.share.alive:
            try:
                t.device_ref.share.check()
            except InferdError as exc:
                return exc
    return None


def batch_result(requests: Sequence[InferRequest], ids: Sequence[int], msg: dict[str, Any], data: Sequence[Any],
                 version: str, outputs_in_shm: Any = None) -> BatchResult:
    """An ExecuteResult header (as `parse` returns it) and its data frames as core responses; output
    tensors are views of the frames. KeyError/TypeError/ValueError when the worker sent nonsense."""
    if msg.get("t") == "execute_result_columns":
        return _columns_result(requests, ids, msg, data, version)
    responses = msg["responses"]
    if len(responses) != len(requests):
        raise ValueError(f"{len(responses)} responses for {len(requests)} requests")
    buffers = list(data)
    out: list[InferResponse | InferdError] = []
    for req, rid, item in zip(requests, ids, responses, strict=True):
        if item["request_id"] != rid:
            raise ValueError("responses out of order")
        err = item.get("error")
        if err is not None:
            try:
                code = ErrorCode(err["code"])
            except ValueError:
                code = ErrorCode.INTERNAL
            out.append(InferdError(code, str(err["message"])))
            continue
        outputs = []
        for ref in item.get("outputs") or ():
            name = ref["name"]
            loc = ref.get("loc", "frame")
            if loc == "shm":
                outputs.append(shm_output(name, ref["datatype"], ref["shape"], ref.get("region"),
                                          ref.get("offset", 0), ref.get("nbytes", 0), outputs_in_shm))
                continue
            if loc == "cuda":
                outputs.append(device_output(req, m.TensorRef(**ref), outputs_in_shm))
                continue
            if loc != "frame":
                raise ValueError(f"output '{name}' has a bad reference")
            buf = output_buffer(name, ref.get("frame", -1), ref.get("offset", 0), ref.get("nbytes", 0), buffers)
            outputs.append(Tensor(name, ref["datatype"], ref["shape"], buf))
        gone = _dead_device_input(req)
        if gone is not None:  # an input lived in a worker that died meanwhile: the result cannot be trusted
            out.append(gone)  # (its own device outputs are released as `outputs` is dropped)
            continue
        out.append(InferResponse(req.model_name, version or req.model_version, req.id, outputs,
                                 item.get("parameters") or {}))
    return BatchResult(out, int(msg.get("compute_input_ns", 0)), int(msg.get("compute_infer_ns", 0)),
                       int(msg.get("compute_output_ns", 0)))


def _columns_result(requests: Sequence[InferRequest], ids: Sequence[int], msg: dict[str, Any], data: Sequence[Any],
                    version: str) -> BatchResult:
    """`batch_result` of an ExecuteResultColumns: request i's output is row i of its column's frame."""
    if msg["request_ids"] != list(ids):
        raise ValueError("responses out of order")
    count = len(requests)
    columns = []
    for column in msg["outputs"]:
        name, datatype, shape, frame = column["name"], column["datatype"], column["shape"], column["frame"]
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
    for i, req in enumerate(requests):
        outputs = [Tensor(name, datatype, list(shape), view[i * size:(i + 1) * size])
                   for name, datatype, shape, view, size in columns]
        out.append(InferResponse(req.model_name, version or req.model_version, req.id, outputs, {}))
    return BatchResult(out, int(msg.get("compute_input_ns", 0)), int(msg.get("compute_infer_ns", 0)),
                       int(msg.get("compute_output_ns", 0)))


def stream_response(req: InferRequest, msg: m.StreamResponse, data: Sequence[Any],
                    version: str, outputs_in_shm: Any = None) -> InferResponse | InferdError:
    """One StreamResponse as a core response (a flag-only final: a response without outputs) or
    the error it carries. ValueError when the worker sent nonsense."""
    item = msg.response
    if item is None:
        return InferResponse(req.model_name, version or req.model_version, req.id)
    if item.error is not None:
        try:
            code = ErrorCode(item.error.code)
        except ValueError:
            code = ErrorCode.INTERNAL
        return InferdError(code, str(item.error.message))
    buffers = list(data)
    outputs = []
    for ref in item.outputs:
        if ref.loc == "shm":
            outputs.append(shm_output(ref.name, ref.datatype, list(ref.shape), ref.region, ref.offset, ref.nbytes,
                                      outputs_in_shm))
            continue
        if ref.loc == "cuda":
            outputs.append(device_output(req, ref, outputs_in_shm))
            continue
        if ref.loc != "frame":
            raise ValueError(f"output '{ref.name}' has a bad reference")
        buf = output_buffer(ref.name, ref.frame, ref.offset, ref.nbytes, buffers)
        outputs.append(Tensor(ref.name, ref.datatype, list(ref.shape), buf))
    gone = _dead_device_input(req)
    if gone is not None:
        return gone
    params = item.parameters if isinstance(item.parameters, dict) else {}
    return InferResponse(req.model_name, version or req.model_version, req.id, outputs, dict(params))
