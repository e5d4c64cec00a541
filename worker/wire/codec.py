"""The codec of supervisor<->worker messages (wire.schema): one encoder and one decoder, their fast paths inside.

A message travels as ZeroMQ frames: frame 0 is a JSON header `{...fields, "t": <type tag>}`, the
following frames carry inline tensor bytes referenced by index and offset (small tensors share a
frame). Larger tensors live in POSIX shared memory and are referenced by (region, offset, nbytes).
No pickle: every message is one of the schema's dataclasses, decoded by its tag into that class;
unknown tags or fields are a protocol error.

One encoder and one decoder per message, each with its fast path inside it:
- Execute / ExecuteColumns: written by the supervisor from plain values (`tensor_ref`, `request_item`,
  `execute_header`, `execute_columns_header`; fields at their default left out), read by the worker
  (`decode_header`, the parsed objects becoming the instances' attribute dicts);
- ExecuteResult / ExecuteResultColumns / StreamResponse: written by the worker from plain values
  (`output_ref_json` ... `execute_result_header`), which `encode_header` also uses for such messages as
  objects (every field written there), read by the supervisor (`decode_header` again).
tests/unit/instances/test_wire_golden.py pins the bytes of every path; tests/unit/worker/test_hot_path.py
the equivalence of the fast decoders with the generic one.

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

_orjson_dumps: Optional[Callable[[Any], bytes]]
try:  # the supervisor has orjson; a worker's environment may not (it never writes an Execute)
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - the golden tests force the fallback
    _orjson_dumps = None


class ProtocolError(Exception):
    """A peer sent something that is not a valid message of this wire version."""


_dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def encode(message: Any, frames: Sequence[Any] = ()) -> list[Any]:
    """Frames for `message`: a JSON header then the given data frames (buffers, sent zero-copy)."""
    return [encode_header(message), *frames]


def encode_header(message: Any) -> bytes:
    """The JSON header frame of `message` (what `encode` puts first). An ExecuteResult or StreamResponse
    goes through the worker's writers below, every field written (the generic form)."""
    writer = _OBJECT_WRITERS.get(type(message))
    if writer is not None:
        try:
            text = writer(message)
        except (TypeError, ValueError):  # e.g. parameters json cannot encode: the generic path says so
            text = None
        if text is not None:
            return text
    header = _plain(message)
    header["t"] = TAGS[type(message)]
    return _dumps(header).encode()


def decode(frames: Sequence[Any], loads: Optional[Callable[[Any], Any]] = None) -> tuple[Any, Sequence[Any]]:
    """(message, data frames) from received frames; raises ProtocolError on anything malformed. `loads`
    as for `decode_header` (orjson.loads, given by the supervisor, also takes a memoryview as it is)."""
    if not frames:
        raise ProtocolError("empty message")
    first = frames[0]
    if type(first) is not bytes and (loads is None or type(first) is not memoryview):
        first = first.bytes if hasattr(first, "bytes") else bytes(first)
    return decode_header(first, loads), frames[1:]


def decode_header(raw: Any, loads: Optional[Callable[[Any], Any]] = None) -> Any:
    """The message of a JSON header frame; raises ProtocolError on anything malformed. `loads`, if
    given, parses the JSON instead of `json_loads` (and must give the same values and errors)."""
    try:
        header = (loads or _loads)(raw)
        if type(header) is not dict:
            raise TypeError("message header is not a JSON object")
        cls = MESSAGE_TYPES[header.pop("t")]
        fast = _FAST_DECODERS.get(cls)
        if fast is not None:
            message = fast(header)
            if message is not None:
                return message
            if cls is ExecuteResult:  # its fast decoder may have changed `header` before giving up
                header = (loads or _loads)(raw)
                del header["t"]
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


# ---- fast decoders: Execute (worker), ExecuteResult / ExecuteResultColumns (supervisor) ---------------
# Same result as the generic `_build` (tests pin the equivalence): the parsed JSON objects become the
# instances' attribute dicts. A field left out keeps its default, which a dataclass holds as a class
# attribute (read when the instance dict lacks the key); a default_factory field left out is filled in.
# Anything unusual (a missing or extra field, a list that is not one) returns None, and `_build` decides
# (on the header as parsed: only the ExecuteResult decoder changes it as it goes).

def _required(cls: type[Any]) -> frozenset[str]:
    """Fields of `cls` without a default."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


_EXECUTE_KEYS = frozenset(_field_names(Execute))
_REQUEST_KEYS = frozenset(_field_names(RequestItem))
_REQUEST_REQUIRED = _required(RequestItem)
_TENSOR_KEYS = frozenset(_field_names(TensorRef))
_TENSOR_REQUIRED = _required(TensorRef)
_RESULT_KEYS = frozenset(_field_names(ExecuteResult))
_RESULT_REQUIRED = _required(ExecuteResult)
_RESPONSE_KEYS = frozenset(_field_names(ResponseItem))
_ERROR_KEYS = frozenset(_field_names(WireError))
_COLUMNS_RESULT_KEYS = frozenset(_field_names(ExecuteResultColumns))
_COLUMNS_RESULT_REQUIRED = _required(ExecuteResultColumns)
_COLUMN_KEYS = frozenset(_field_names(TensorColumn))
_new = object.__new__


# The checks below spell out a TensorRef's required fields (name, datatype, shape: `"name" in ref` is cheaper
# than a set comparison); tests/unit/worker/test_hot_path.py holds them to the schema.


def _refs_ok(refs: Any) -> bool:
    """`refs` is a list of TensorRef objects (JSON) that `_as_refs` may turn into TensorRefs."""
    if type(refs) is not list:
        return False
    keys = _TENSOR_KEYS
    for ref in refs:
        if type(ref) is not dict or not ref.keys() <= keys or "name" not in ref or "datatype" not in ref \
                or "shape" not in ref:
            return False
    return True


def _as_refs(refs: list[Any]) -> list[Any]:
    """The parsed TensorRef objects of `refs` (checked by `_refs_ok`) become TensorRefs, in place."""
    new = _new
    for i, ref in enumerate(refs):
        tensor = new(TensorRef)
        tensor.__dict__ = ref
        refs[i] = tensor
    return refs


def _execute_fast(header: dict[str, Any]) -> Optional[Execute]:
    """An Execute as the supervisor sends it (`execute_header`)."""
    if header.keys() != _EXECUTE_KEYS:
        return None
    items = header["requests"]
    if type(items) is not list:
        return None
    for item in items:
        if type(item) is not dict or not _REQUEST_REQUIRED <= item.keys() <= _REQUEST_KEYS:
            return None
        if not _refs_ok(item["inputs"]):
            return None
    new = _new
    for i, item in enumerate(items):
        _as_refs(item["inputs"])
        request = new(RequestItem)
        request.__dict__ = item
        items[i] = request
    message = new(Execute)
    message.__dict__ = header
    return message


def _execute_result_fast(header: dict[str, Any]) -> Optional[ExecuteResult]:
    """An ExecuteResult as the worker sends it (`execute_result_header`), checked and built in one pass
    (the supervisor reads one per batch): None may leave `header` half changed, and `decode_header`
    parses the frame again for `_build`."""
    if not _RESULT_REQUIRED <= header.keys() <= _RESULT_KEYS:
        return None
    items = header["responses"]
    if type(items) is not list:
        return None
    item_keys, ref_keys, new = _RESPONSE_KEYS, _TENSOR_KEYS, _new
    for i, item in enumerate(items):
        if type(item) is not dict or not item.keys() <= item_keys or "request_id" not in item:
            return None
        refs = item.get("outputs")
        if type(refs) is list:
            for j, ref in enumerate(refs):
                if type(ref) is not dict or not ref.keys() <= ref_keys or "name" not in ref \
                        or "datatype" not in ref or "shape" not in ref:
                    return None
                tensor = refs[j] = new(TensorRef)
                tensor.__dict__ = ref
        elif refs is None and "outputs" not in item:
            item["outputs"] = []
        else:
            return None
        error = item.get("error")
        if error is not None:
            if type(error) is not dict or error.keys() != _ERROR_KEYS:
                return None
            wire_error = item["error"] = new(WireError)
            wire_error.__dict__ = error
        if "parameters" not in item:
            item["parameters"] = {}
        response = items[i] = new(ResponseItem)
        response.__dict__ = item
    message = new(ExecuteResult)
    message.__dict__ = header
    return message


def _execute_result_columns_fast(header: dict[str, Any]) -> Optional[ExecuteResultColumns]:
    """An ExecuteResultColumns as the worker sends it (`execute_result_columns_header`)."""
    if not _COLUMNS_RESULT_REQUIRED <= header.keys() <= _COLUMNS_RESULT_KEYS:
        return None
    outputs = header["outputs"]
    if type(outputs) is not list:
        return None
    for fields in outputs:
        if type(fields) is not dict or fields.keys() != _COLUMN_KEYS:
            return None
    new = _new
    for i, fields in enumerate(outputs):
        column = outputs[i] = new(TensorColumn)
        column.__dict__ = fields
    message = new(ExecuteResultColumns)
    message.__dict__ = header
    return message


_FAST_DECODERS: dict[type[Any], Callable[[dict[str, Any]], Any]] = {
    Execute: _execute_fast,
    ExecuteResult: _execute_result_fast,
    ExecuteResultColumns: _execute_result_columns_fast,
}


# ---- Execute / ExecuteColumns out: the supervisor's writer ----------------------------------------------
# Plain dicts in the dataclasses' field order, fields at their default left out (every decoder fills them
# in), serialized with orjson where installed, else json with the same output (UTF-8, no spaces; the
# values are strings, ints, bools and lists of them: no floats, where the two could differ).

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


def execute_header(batch_id: int, items: list[dict[str, Any]], forget_regions: list[str]) -> bytes:
    """The header frame of an Execute; `items` from `request_item`."""
    return _dumpb({"batch_id": batch_id, "requests": items, "forget_regions": forget_regions, "t": "execute"})


def execute_columns_header(batch_id: int, request_ids: list[int], inputs: Sequence[tuple[str, str, Sequence[int]]],
                           ids: list[str], requested_outputs: list[str], forget_regions: list[str]) -> bytes:
    """The header frame of an ExecuteColumns whose input i (name, datatype, shape) is data frame i; `ids`
    all "" and `requested_outputs` empty are left out (their defaults)."""
    header: dict[str, Any] = {
        "batch_id": batch_id, "request_ids": request_ids,
        "inputs": [{"name": name, "datatype": datatype, "shape": list(shape), "frame": i}
                   for i, (name, datatype, shape) in enumerate(inputs)]}
    if any(ids):
        header["ids"] = ids
    if requested_outputs:
        header["requested_outputs"] = requested_outputs
    header["forget_regions"] = forget_regions
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


# ---- ExecuteResult / ExecuteResultColumns / StreamResponse out: the worker's writer -----------------
# Written straight from values (no ResponseItem/TensorRef objects, no per-field type checks: every
# value comes from the worker's own checked code) and leaving out fields at their default (a
# TensorRef's loc "frame" and region "", a ResponseItem's error null and parameters {}), which every
# decoder fills in: about half the per-output cost of building objects and encoding them.
# `encode_header` writes such messages given as objects with the same functions, every field written
# (the generic form: `_execute_result_text`, `_stream_response_text`).

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


# ---- the same writers for messages given as objects (encode_header) -----------------------------------
# None when a field does not have its declared type: the generic path then encodes (or refuses) it.

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
    refs = []
    for ref in item.outputs:
        text = _tensor_ref_text(ref)
        if text is None:
            return None
        refs.append(text)
    return response_item_json(request_id, refs, error, params, every_field=True)


def _execute_result_text(message: ExecuteResult) -> Optional[bytes]:
    batch_id, t_in, t_infer, t_out = (message.batch_id, message.compute_input_ns, message.compute_infer_ns,
                                      message.compute_output_ns)
    if not (type(batch_id) is int and type(t_in) is int and type(t_infer) is int and type(t_out) is int
            and type(message.responses) in (list, tuple)):
        return None
    items = []
    for item in message.responses:
        text = _response_item_text(item)
        if text is None:
            return None
        items.append(text)
    return execute_result_header(batch_id, items, t_in, t_infer, t_out)


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


_OBJECT_WRITERS: dict[type[Any], Callable[[Any], Optional[bytes]]] = {
    ExecuteResult: _execute_result_text,
    StreamResponse: _stream_response_text,
}
