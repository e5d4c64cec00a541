"""The codec's writers of the messages on the request path, from plain values (wire.codec is the codec:
`encode_header` uses them for ExecuteResult / StreamResponse objects; docs/worker-protocol.md the contract).

- Execute / ExecuteColumns, written by the supervisor (instances/packing.py): plain dicts in the
  dataclasses' field order, fields at their default left out, serialized with orjson where installed,
  else json with the same bytes (UTF-8, no spaces; the values are strings, ints, bools and lists of them:
  no floats, where the two could differ).
- ExecuteResult / ExecuteResultColumns / StreamResponse, written by the worker (worker/result_writer.py):
  JSON text straight from values (no ResponseItem/TensorRef objects, no per-field type checks: every
  value comes from the worker's own checked code), fields at their default left out (a TensorRef's loc
  "frame" and region "", a ResponseItem's error null and parameters {}); `FramePacker` places the bytes.
  For such messages given as objects (`encode_header`) the same functions write every field.
Every decoder fills the defaults in. tests/unit/instances/test_wire_golden.py pins the bytes.

Runs on Python 3.9+ (worker environments), so no `match`, no slots=, no `X | Y` at runtime.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Optional

from .schema import (
    ZERO_COPY_MIN_BYTES,
    ExecuteResult,
    ResponseItem,
    StreamResponse,
    TensorRef,
    WireError,
)

_orjson_dumps: Optional[Callable[[Any], bytes]]
try:  # the supervisor has orjson; a worker's environment may not (it never writes an Execute)
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - the golden tests force the fallback
    _orjson_dumps = None

# compact ASCII JSON: the generic encoder's (wire.codec) and the parameters of a ResponseItem
dumps_ascii = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
_dumps = dumps_ascii


# ---- Execute / ExecuteColumns: the supervisor's writer ----------------------------------------------------

_json_utf8 = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def _dumpb_json(obj: Any) -> bytes:
    return _json_utf8(obj).encode()


_dumpb: Callable[[Any], bytes] = _orjson_dumps if _orjson_dumps is not None else _dumpb_json


def tensor_ref(name: str, datatype: str, shape: Sequence[int], loc: str, frame: int, region: str,
               offset: int, nbytes: int, device: int = 0, owner: str = "") -> dict[str, Any]:
    """A TensorRef of `execute_header` (an input)."""
    if loc == "frame":  # loc "frame" and region "" are TensorRef's defaults: left out
        return {"name": name, "datatype": datatype, "shape": list(shape), "frame": frame, "offset": offset,
                "nbytes": nbytes}
    ref = {"name": name, "datatype": datatype, "shape": list(shape), "loc": loc, "frame": frame,
           "region": region, "offset": offset, "nbytes": nbytes}
    if loc == "cuda":  # device and owner matter only for device memory (defaults 0 and "" otherwise)
        ref["device"] = device
        ref["owner"] = owner
    return ref


def request_item(request_id: int, id: str, inputs: list[dict[str, Any]], requested_outputs: list[str],
                 parameters: str = "{}", correlation_id: Any = 0, flags: int = 0, timeout_us: int = 0,
                 device_outputs: bool = False, trace: str = "") -> dict[str, Any]:
    """A RequestItem of `execute_header`; `inputs` from `tensor_ref`."""
    item = {"request_id": request_id, "id": id, "inputs": inputs, "requested_outputs": requested_outputs}
    if parameters != "{}":
        item["parameters"] = parameters
    if not (type(correlation_id) is int and correlation_id == 0):
        item["correlation_id"] = correlation_id
    if flags:
        item["flags"] = flags
    if timeout_us:
        item["timeout_us"] = timeout_us
    if device_outputs:
        item["device_outputs"] = True
    if trace:
        item["trace"] = trace
    return item


def execute_header(batch_id: int, items: list[dict[str, Any]], forget_regions: list[str], poll_us: int = 0) -> bytes:
    """The header frame of an Execute; `items` from `request_item`."""
    return _dumpb({"batch_id": batch_id, "requests": items, "forget_regions": forget_regions, "poll_us": poll_us,
                   "t": "execute"})


def execute_columns_header(batch_id: int, request_ids: list[int], inputs: Sequence[tuple[str, str, Sequence[int]]],
                           ids: list[str], requested_outputs: list[str], forget_regions: list[str],
                           poll_us: int = 0) -> bytes:
    """The header frame of an ExecuteColumns whose input i (name, datatype, shape) is data frame i; `ids`
    all "", `requested_outputs` empty and `poll_us` 0 are left out (their defaults)."""
    header: dict[str, Any] = {
        "batch_id": batch_id, "request_ids": request_ids,
        "inputs": [{"name": name, "datatype": datatype, "shape": list(shape), "frame": i}
                   for i, (name, datatype, shape) in enumerate(inputs)]}
    if any(ids):
        header["ids"] = ids
    if requested_outputs:
        header["requested_outputs"] = requested_outputs
    header["forget_regions"] = forget_regions
    if poll_us:
        header["poll_us"] = poll_us
    header["t"] = "execute_columns"
    return _dumpb(header)


class FramePacker:
    """The data frames of one message: buffers below ZERO_COPY_MIN_BYTES share one frame (each at
    its offset), bigger ones get their own (sent zero-copy). Each frame costs a ZeroMQ send and a
    receive (with a Frame object), far more than copying a few small buffers once."""

    __slots__ = ("frames", "_parts", "_index", "_size")

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self._parts: list[Any] = []
        self._index = -1  # the shared frame's index, once a small buffer has come
        self._size = 0

    def add(self, data: Any, nbytes: int) -> tuple[int, int]:
        """(frame index, offset) where `data` (`nbytes` long) will be. An empty buffer gets an empty
        frame of its own: (offset 0, nbytes 0) names a whole frame (references that carry no size)."""
        if nbytes >= ZERO_COPY_MIN_BYTES or nbytes == 0:
            self.frames.append(data if nbytes else b"")
            return len(self.frames) - 1, 0
        if self._index < 0:
            self._index = len(self.frames)
            self.frames.append(b"")
        offset = self._size
        self._parts.append(data)
        self._size += nbytes
        return self._index, offset

    def finish(self) -> list[Any]:
        """The frames, the shared one filled in."""
        if self._index >= 0:
            self.frames[self._index] = b"".join(self._parts)
        return self.frames


# ---- ExecuteResult / ExecuteResultColumns / StreamResponse: the worker's writer -----------------------

_REF_HEADS: dict[tuple[str, str], str] = {}  # (name, datatype) -> '{"name":..,"datatype":..,"shape":['
_SHAPES: dict[tuple[int, ...], str] = {}  # shape tuple -> "1,4": batches repeat a few shapes


def output_ref_json(name: str, datatype: str, shape: Sequence[int], frame: int, offset: int, nbytes: int) -> str:
    """A TensorRef (loc "frame": `nbytes` bytes at `offset` of data frame `frame`) as compact JSON."""
    head = _REF_HEADS.get((name, datatype))
    if head is None:
        head = '{"name":%s,"datatype":%s,"shape":[' % (_json_str(name), _json_str(datatype))
        if len(_REF_HEADS) < 4096:  # output names come from the model config: few, but stay bounded
            _REF_HEADS[(name, datatype)] = head
    dims = _SHAPES.get(shape) if type(shape) is tuple else None
    if dims is None:
        dims = ",".join(map(str, shape))
        if type(shape) is tuple and len(_SHAPES) < 4096:
            _SHAPES[shape] = dims
    return '%s%s],"frame":%d,"offset":%d,"nbytes":%d}' % (head, dims, frame, offset, nbytes)


def output_shm_ref_json(name: str, datatype: str, shape: Sequence[int], region: str, nbytes: int) -> str:
    """A TensorRef for an output the worker wrote into its own region (loc "shm", offset 0)."""
    return '{"name":%s,"datatype":%s,"shape":[%s],"loc":"shm","region":%s,"offset":0,"nbytes":%d}' % (
        _json_str(name), _json_str(datatype), ",".join(map(str, shape)), _json_str(region), nbytes)


def device_ref_json(name: str, datatype: str, shape: Sequence[int], region: str, offset: int, nbytes: int,
                    device: int, owner: str) -> str:
    """A TensorRef for a device output passed on by CUDA IPC handle (loc "cuda")."""
    return ('{"name":%s,"datatype":%s,"shape":[%s],"loc":"cuda","region":%s,"offset":%d,"nbytes":%d,'
            '"device":%d,"owner":%s}' % (_json_str(name), _json_str(datatype), ",".join(map(str, shape)),
                                         _json_str(region), offset, nbytes, device, _json_str(owner)))


def response_item_json(request_id: int, refs: Sequence[str], error: Optional[WireError] = None,
                       parameters: Optional[dict[str, Any]] = None, every_field: bool = False) -> str:
    """A ResponseItem as compact JSON (`every_field`: error and parameters also at their default);
    `refs` from `output_ref_json` and its siblings."""
    text = '{"request_id":%d,"outputs":[%s]' % (request_id, ",".join(refs))
    if error is not None:
        text += ',"error":{"code":%d,"message":%s}' % (error.code, _json_str(error.message))
    elif every_field:
        text += ',"error":null'
    if parameters:
        text += ',"parameters":' + _dumps(parameters)
    elif every_field:
        text += ',"parameters":{}'
    return text + "}"


def execute_result_header(batch_id: int, items: Sequence[str], compute_input_ns: int = 0,
                          compute_infer_ns: int = 0, compute_output_ns: int = 0) -> bytes:
    """The header frame of an ExecuteResult whose responses are `response_item_json` texts."""
    return ('{"batch_id":%d,"responses":[%s],"compute_input_ns":%d,"compute_infer_ns":%d,'
            '"compute_output_ns":%d,"t":"execute_result"}' % (
                batch_id, ",".join(items), compute_input_ns, compute_infer_ns, compute_output_ns)).encode()


def _int_list_text(values: Sequence[int]) -> str:
    """`[1,2,3]`: a JSON list of ints (the worker's request ids), by orjson where installed (a tenth of the
    cost of str() per value for a batch of 32), else by str(); the same text."""
    return "[%s]" % ",".join(map(str, values))


def _int_list_orjson(values: Sequence[int]) -> str:
    if type(values) is list:
        try:
            return _orjson_dumps(values).decode()  # type: ignore[misc]
        except TypeError:  # (an int beyond 64 bits, or a value that is not an int): str() below
            pass
    return _int_list_text(values)


_int_list: Callable[[Sequence[int]], str] = _int_list_orjson if _orjson_dumps is not None else _int_list_text


def execute_result_columns_header(batch_id: int, request_ids: Sequence[int],
                                  outputs: Sequence[tuple[str, str, Sequence[int]]], compute_input_ns: int = 0,
                                  compute_infer_ns: int = 0, compute_output_ns: int = 0) -> bytes:
    """The header frame of an ExecuteResultColumns whose output i is data frame i."""
    columns = ",".join('{"name":%s,"datatype":%s,"shape":[%s],"frame":%d}' % (
        _json_str(name), _json_str(datatype), ",".join(map(str, shape)), frame)
        for frame, (name, datatype, shape) in enumerate(outputs))
    return ('{"batch_id":%d,"request_ids":%s,"outputs":[%s],"compute_input_ns":%d,"compute_infer_ns":%d,'
            '"compute_output_ns":%d,"t":"execute_result_columns"}' % (
                batch_id, _int_list(request_ids), columns, compute_input_ns, compute_infer_ns,
                compute_output_ns)).encode()


def stream_response_header(request_id: int, final: bool, item: Optional[str]) -> bytes:
    """The header frame of a StreamResponse; `item` a `response_item_json` text or None (flag-only)."""
    return ('{"request_id":%d,"final":%s,"response":%s,"t":"stream_response"}' % (
        request_id, "true" if final else "false", "null" if item is None else item)).encode()


# ---- the same writers for messages given as objects (wire.codec.encode_header), every field written ---
# None when a field does not have its declared type: the generic path then encodes (or refuses) it.

def _texts(values: Any, write: Callable[[Any], Optional[str]]) -> Optional[list[str]]:
    """`write` of every value, or None where one of them gives None."""
    texts = []
    for value in values:
        text = write(value)
        if text is None:
            return None
        texts.append(text)
    return texts


def _tensor_ref_text(ref: Any) -> Optional[str]:
    """A TensorRef with every field, as `_plain` + `_dumps` would write it."""
    if type(ref) is not TensorRef:
        return None
    name, datatype, shape, loc, region = ref.name, ref.datatype, ref.shape, ref.loc, ref.region
    frame, offset, nbytes, device, owner = ref.frame, ref.offset, ref.nbytes, ref.device, ref.owner
    if not (type(name) is str and type(datatype) is str and type(loc) is str and type(region) is str
            and type(frame) is int and type(offset) is int and type(nbytes) is int
            and type(device) is int and type(owner) is str
            and type(shape) in (list, tuple) and all(type(s) is int for s in shape)):
        return None
    return ('{"name":%s,"datatype":%s,"shape":[%s],"loc":%s,"frame":%d,"region":%s,"offset":%d,"nbytes":%d,'
            '"device":%d,"owner":%s}' % (_json_str(name), _json_str(datatype), ",".join(map(str, shape)),
                                         _json_str(loc), frame, _json_str(region), offset, nbytes, device,
                                         _json_str(owner)))


def _response_item_text(item: Any) -> Optional[str]:
    """A ResponseItem with every field (`response_item_json`, every_field)."""
    if type(item) is not ResponseItem:
        return None
    request_id, error, params = item.request_id, item.error, item.parameters
    if type(request_id) is not int or type(params) is not dict or type(item.outputs) not in (list, tuple):
        return None
    if error is not None and not (type(error) is WireError and type(error.code) is int
                                  and type(error.message) is str):
        return None
    refs = _texts(item.outputs, _tensor_ref_text)
    return None if refs is None else response_item_json(request_id, refs, error, params, every_field=True)


def _execute_result_text(message: ExecuteResult) -> Optional[bytes]:
    batch_id, t_in, t_infer, t_out = (message.batch_id, message.compute_input_ns, message.compute_infer_ns,
                                      message.compute_output_ns)
    if not (type(batch_id) is int and type(t_in) is int and type(t_infer) is int and type(t_out) is int
            and type(message.responses) in (list, tuple)):
        return None
    items = _texts(message.responses, _response_item_text)
    return None if items is None else execute_result_header(batch_id, items, t_in, t_infer, t_out)


def _stream_response_text(message: StreamResponse) -> Optional[bytes]:
    request_id, final = message.request_id, message.final
    if type(request_id) is not int or type(final) is not bool:
        return None
    item = None
    if message.response is not None:
        item = _response_item_text(message.response)
        if item is None:
            return None
    return stream_response_header(request_id, final, item)


OBJECT_WRITERS: dict[type[Any], Callable[[Any], Optional[bytes]]] = {
    ExecuteResult: _execute_result_text,
    StreamResponse: _stream_response_text,
}
