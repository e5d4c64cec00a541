"""The codec of supervisor<->worker messages (wire.schema): one encoder and one decoder, their fast paths inside.

A message travels as ZeroMQ frames: frame 0 is a JSON header `{...fields, "t": <type tag>}`, the
following frames carry inline tensor bytes referenced by index and offset (small tensors share a
frame). Larger tensors live in POSIX shared memory and are referenced by (region, offset, nbytes).
No pickle: every message is one of the schema's dataclasses, decoded by its tag into that class;
unknown tags or fields are a protocol error. Hot paths (an Execute decoded, an ExecuteResult or
StreamResponse written by the worker) give the same bytes and values as the generic path
(tests/unit/instances/test_wire_golden.py pins the bytes, tests/unit/worker/test_hot_path.py the
equivalence). The supervisor's own Execute writer (orjson) is supervisor.instances.codec.

Runs on Python 3.9+ (worker environments), so no `match`, no slots=, no `X | Y` at runtime.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Optional

from .schema import (
    MESSAGE_TYPES,
    TAGS,
    ZERO_COPY_MIN_BYTES,
    BlsRequest,
    BlsResponse,
    Execute,
    ExecuteColumns,
    ExecuteResult,
    ExecuteResultColumns,
    RequestItem,
    ResponseItem,
    StreamResponse,
    TensorColumn,
    TensorRef,
    WireError,
)


class ProtocolError(Exception):
    """A peer sent something that is not a valid message of this wire version."""


_dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def encode(message: Any, frames: Sequence[Any] = ()) -> list[Any]:
    """Frames for `message`: a JSON header then the given data frames (buffers, sent zero-copy)."""
    return [encode_header(message), *frames]


def encode_header(message: Any) -> bytes:
    """The JSON header frame of `message` (what `encode` puts first)."""
    header = _plain(message)
    header["t"] = TAGS[type(message)]
    return _dumps(header).encode()


def decode(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """(message, data frames) from received frames; raises ProtocolError on anything malformed."""
    if not frames:
        raise ProtocolError("empty message")
    first = frames[0]
    return decode_header(first if type(first) is bytes else first.bytes if hasattr(first, "bytes")
                         else bytes(first)), frames[1:]


def decode_header(raw: bytes, loads: Optional[Callable[[bytes], Any]] = None) -> Any:
    """The message of a JSON header frame; raises ProtocolError on anything malformed. `loads`, if
    given, parses the JSON instead of `json_loads` (and must give the same values and errors)."""
    try:
        header = (loads or _loads)(raw)
        if type(header) is not dict:
            raise TypeError("message header is not a JSON object")
        cls = MESSAGE_TYPES[header.pop("t")]
        if cls is Execute:
            message = _execute_fast(header)
            if message is not None:
                return message
        return _build(cls, header)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ProtocolError("malformed message: %s" % exc) from None


_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _loads(raw: bytes) -> Any:
    """`json.loads(raw)` for a UTF-8 JSON object without surrounding whitespace (every header the
    supervisor sends), minus json.loads's encoding detection and regex passes; anything else, and
    every error, is left to json.loads itself."""
    if raw[:1] == b"{" and raw[1:2] != b"\x00":
        try:
            text = raw.decode("utf-8", "surrogatepass")
            value, end = _scan_once(text, 0)
            if end == len(text):
                return value
        except Exception:  # noqa: S110 - json.loads below raises its own error
            pass
    return json.loads(raw)


json_loads = _loads


_NESTED = {
    (RequestItem, "inputs"): TensorRef,
    (ResponseItem, "outputs"): TensorRef,
    (Execute, "requests"): RequestItem,
    (ExecuteResult, "responses"): ResponseItem,
    (ExecuteColumns, "inputs"): TensorColumn,
    (ExecuteResultColumns, "outputs"): TensorColumn,
    (BlsRequest, "inputs"): TensorRef,
    (BlsResponse, "outputs"): TensorRef,
}


_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _plain(obj: Any) -> Any:
    """Like dataclasses.asdict (dataclasses -> dicts, lists/tuples -> lists), without deep copies."""
    names = _FIELDS.get(type(obj))
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _field_names(type(obj))
    if names is not None:
        return {name: _plain(getattr(obj, name)) for name in names}
    if isinstance(obj, (list, tuple)):
        return [_plain(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _plain(value) for key, value in obj.items()}
    return obj


def _build(cls: type[Any], data: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        raise TypeError("%s must be a JSON object" % cls.__name__)
    kwargs = {}
    names = _field_names(cls)
    for key, value in data.items():
        if key not in names:
            raise TypeError("unknown field %r for %s" % (key, cls.__name__))
        item_cls = _NESTED.get((cls, key))
        if item_cls is not None:
            if not isinstance(value, list):
                raise TypeError("field %r of %s must be a list" % (key, cls.__name__))
            value = [_build(item_cls, v) for v in value]
        elif key == "error" and value is not None:
            value = WireError(**value)
        elif (cls, key) == (StreamResponse, "response") and value is not None:
            value = _build(ResponseItem, value)
        kwargs[key] = value
    return cls(**kwargs)


# ---- hot path: Execute in ------------------------------------------------------------------------
# Same result as the generic `_build` (tests pin the equivalence);
# anything unusual (a missing or extra field, a value of another type) takes the generic path.

def _required(cls: type[Any]) -> frozenset[str]:
    """Fields of `cls` without a default."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


_EXECUTE_KEYS = frozenset(_field_names(Execute))
_REQUEST_KEYS = frozenset(_field_names(RequestItem))
_REQUEST_REQUIRED = _required(RequestItem)
_TENSOR_KEYS = frozenset(_field_names(TensorRef))
_TENSOR_REQUIRED = _required(TensorRef)
_new = object.__new__


def _execute_fast(header: dict[str, Any]) -> Optional[Execute]:
    """An Execute as the supervisor sends it, built without `_build`: the parsed JSON objects become
    the instances' attribute dicts. A RequestItem or TensorRef field left out keeps its default, which
    a dataclass holds as a class attribute (read when the instance dict lacks the key); the fields
    without a default must be there. None: use `_build` (nothing has been changed in `header` then)."""
    if header.keys() != _EXECUTE_KEYS:
        return None
    items = header["requests"]
    if type(items) is not list:
        return None
    built = []
    for item in items:
        if type(item) is not dict or not _REQUEST_REQUIRED <= item.keys() <= _REQUEST_KEYS:
            return None
        refs = item["inputs"]
        if type(refs) is not list:
            return None
        inputs = []
        for ref in refs:
            if type(ref) is not dict or not _TENSOR_REQUIRED <= ref.keys() <= _TENSOR_KEYS:
                return None
            tensor = _new(TensorRef)
            tensor.__dict__ = ref
            inputs.append(tensor)
        built.append((item, inputs))
    requests = []
    for item, inputs in built:
        item["inputs"] = inputs
        request = _new(RequestItem)
        request.__dict__ = item
        requests.append(request)
    header["requests"] = requests
    message = _new(Execute)
    message.__dict__ = header
    return message


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


# ---- compact writer: the worker's ExecuteResult / StreamResponse headers -------------------------
# Written straight from values (no ResponseItem/TensorRef objects, no per-field type checks: every
# value comes from the worker's own checked code) and leaving out fields at their default (a
# TensorRef's loc "frame" and region "", a ResponseItem's error null and parameters {}), which every
# decoder fills in: about half the per-output cost of building objects and encoding them.

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
                       parameters: Optional[dict[str, Any]] = None) -> str:
    """A ResponseItem as compact JSON; `refs` from `output_ref_json`."""
    text = '{"request_id":%d,"outputs":[%s]' % (request_id, ",".join(refs))
    if error is not None:
        text += ',"error":{"code":%d,"message":%s}' % (error.code, _json_str(error.message))
    if parameters:
        text += ',"parameters":' + _dumps(parameters)
    return text + "}"


def execute_result_header(batch_id: int, items: Sequence[str], compute_input_ns: int = 0,
                          compute_infer_ns: int = 0, compute_output_ns: int = 0) -> bytes:
    """The header frame of an ExecuteResult whose responses are `response_item_json` texts."""
    return ('{"batch_id":%d,"responses":[%s],"compute_input_ns":%d,"compute_infer_ns":%d,'
            '"compute_output_ns":%d,"t":"execute_result"}' % (
                batch_id, ",".join(items), compute_input_ns, compute_infer_ns, compute_output_ns)).encode()


def execute_result_columns_header(batch_id: int, request_ids: Sequence[int],
                                  outputs: Sequence[tuple[str, str, Sequence[int]]], compute_input_ns: int = 0,
                                  compute_infer_ns: int = 0, compute_output_ns: int = 0) -> bytes:
    """The header frame of an ExecuteResultColumns whose output i is data frame i."""
    columns = ",".join('{"name":%s,"datatype":%s,"shape":[%s],"frame":%d}' % (
        _json_str(name), _json_str(datatype), ",".join(map(str, shape)), frame)
        for frame, (name, datatype, shape) in enumerate(outputs))
    return ('{"batch_id":%d,"request_ids":[%s],"outputs":[%s],"compute_input_ns":%d,"compute_infer_ns":%d,'
            '"compute_output_ns":%d,"t":"execute_result_columns"}' % (
                batch_id, ",".join(map(str, request_ids)), columns, compute_input_ns, compute_infer_ns,
                compute_output_ns)).encode()


def stream_response_header(request_id: int, final: bool, item: Optional[str]) -> bytes:
    """The header frame of a StreamResponse; `item` a `response_item_json` text or None (flag-only)."""
    return ('{"request_id":%d,"final":%s,"response":%s,"t":"stream_response"}' % (
        request_id, "true" if final else "false", "null" if item is None else item)).encode()
