"""The codec of supervisor<->worker messages (wire.schema): one encoder and one decoder, their fast paths inside.

A message travels as ZeroMQ frames: frame 0 is a JSON header `{...fields, "t": <type tag>}`, the
following frames carry inline tensor bytes referenced by index and offset (small tensors share a
frame). Larger tensors live in POSIX shared memory and are referenced by (region, offset, nbytes).
No pickle: every message is one of the schema's dataclasses, decoded by its tag into that class;
unknown tags or fields are a protocol error.

One encoder and one decoder per message, each with its fast path inside it:
- Execute / ExecuteColumns: written by the supervisor from plain values (wire.writers: `tensor_ref`,
  `request_item`, `execute_header`, `execute_columns_header`; fields at their default left out), read by
  the worker (`decode_header` here, the parsed objects becoming the instances' attribute dicts);
- ExecuteResult / ExecuteResultColumns / StreamResponse: written by the worker from plain values
  (wire.writers: `output_ref_json` ... `execute_result_header`), which `encode_header` also uses for such
  messages given as objects (every field written there), read by the supervisor (`decode_header` again);
- every other message: `encode_header` and `decode_header`'s generic paths.
tests/unit/instances/test_wire_golden.py pins the bytes of every path; tests/unit/worker/test_hot_path.py
the equivalence of the fast paths with the generic ones.

Runs on Python 3.9+ (worker environments), so no `match`, no slots=, no `X | Y` at runtime.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
from collections.abc import Callable, Sequence
from typing import Any, Optional

from .schema import (
    MESSAGE_TYPES,
    TAGS,
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
from .writers import OBJECT_WRITERS, dumps_ascii


class ProtocolError(Exception):
    """A peer sent something that is not a valid message of this wire version."""


_dumps = dumps_ascii


def encode(message: Any, frames: Sequence[Any] = ()) -> list[Any]:
    """Frames for `message`: a JSON header then the given data frames (buffers, sent zero-copy)."""
    return [encode_header(message), *frames]


def encode_header(message: Any) -> bytes:
    """The JSON header frame of `message` (what `encode` puts first). An ExecuteResult or StreamResponse
    goes through the worker's writers (wire.writers), every field written (the generic form)."""
    writer = OBJECT_WRITERS.get(type(message))
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
            if cls is ExecuteResult or cls is Execute or cls is StreamResponse:  # `header` may have changed
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


_MERGED_AT_DEFAULT = (ExecuteResult, ExecuteResultColumns)


def _plain(obj: Any) -> Any:
    """Like dataclasses.asdict (dataclasses -> dicts, lists/tuples -> lists), without deep copies."""
    names = _FIELDS.get(type(obj))
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _field_names(type(obj))
    if names is not None:
        plain = {name: _plain(getattr(obj, name)) for name in names}
        if plain.get("merged", 1) == 0 and type(obj) in _MERGED_AT_DEFAULT:
            del plain["merged"]  # (a field added later: left out at its default, so older encodings stay the same)
        return plain
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
_PLAIN_REQUEST_KEYS = frozenset(("request_id", "id", "inputs", "requested_outputs"))  # request_item's own
_TENSOR_KEYS = frozenset(_field_names(TensorRef))
_TENSOR_REQUIRED = _required(TensorRef)
_RESULT_KEYS = frozenset(_field_names(ExecuteResult))
_RESULT_REQUIRED = _required(ExecuteResult)
_RESPONSE_KEYS = frozenset(_field_names(ResponseItem))
_PLAIN_ITEM_KEYS = frozenset(("request_id", "outputs"))  # a ResponseItem without error and parameters
_FRAME_REF_KEYS = frozenset(("name", "datatype", "shape", "frame", "offset", "nbytes"))  # an output in a frame
_ERROR_KEYS = frozenset(_field_names(WireError))
_STREAM_KEYS = frozenset(_field_names(StreamResponse))
_COLUMNS_RESULT_KEYS = frozenset(_field_names(ExecuteResultColumns))
_COLUMNS_RESULT_REQUIRED = _required(ExecuteResultColumns)
_COLUMN_KEYS = frozenset(_field_names(TensorColumn))
_new = object.__new__


# The checks below spell out a TensorRef's required fields (name, datatype, shape: `"name" in ref` is cheaper
# than a set comparison); tests/unit/worker/test_hot_path.py holds them to the schema.

def _execute_fast(header: dict[str, Any]) -> Optional[Execute]:
    """An Execute as the supervisor sends it (wire.writers.execute_header); the worker reads one per batch.
    Checked and built in one pass, the common shapes (an item of the four fields `request_item` always
    writes, an input in a data frame) told by one key-set comparison each: None may leave `header` half
    changed, and `decode_header` parses the frame again for `_build`."""
    if header.keys() != _EXECUTE_KEYS or type(header["poll_us"]) is not int:
        return None
    items = header["requests"]
    if type(items) is not list:
        return None
    plain_item, frame_ref, new = _PLAIN_REQUEST_KEYS, _FRAME_REF_KEYS, _new
    for i, item in enumerate(items):
        if type(item) is not dict:
            return None
        keys = item.keys()
        if keys != plain_item and not _REQUEST_REQUIRED <= keys <= _REQUEST_KEYS:
            return None
        refs = item["inputs"]
        if type(refs) is not list:
            return None
        for j, ref in enumerate(refs):  # _tensor_refs, inline: the data-frame references of one request
            if type(ref) is not dict or ref.keys() != frame_ref:
                if not _tensor_refs(refs):
                    return None
                break
            tensor = refs[j] = new(TensorRef)
            tensor.__dict__ = ref
        request = items[i] = new(RequestItem)
        request.__dict__ = item
    message = new(Execute)
    message.__dict__ = header
    return message


def _tensor_refs(refs: list[Any]) -> bool:
    """Turn a message's tensor dicts into TensorRefs in place (False: one is not a tensor reference; the
    generic decoder then reads the message and names the problem). A data-frame reference, the common one,
    is told by one key-set comparison."""
    new = _new
    for j, ref in enumerate(refs):
        if type(ref) is TensorRef:  # made by the caller's inline form before it handed the rest over
            continue
        if type(ref) is not dict:
            return False
        if ref.keys() != _FRAME_REF_KEYS and (not ref.keys() <= _TENSOR_KEYS or "name" not in ref
                                              or "datatype" not in ref or "shape" not in ref):
            return False
        tensor = refs[j] = new(TensorRef)
        tensor.__dict__ = ref
    return True


def _execute_result_fast(header: dict[str, Any]) -> Optional[ExecuteResult]:
    """An ExecuteResult as the worker sends it (`execute_result_header`), checked and built in one pass
    (the supervisor reads one per batch): None may leave `header` half changed, and `decode_header`
    parses the frame again for `_build`. The common shapes (every header field; an item of request_id
    and outputs only; an output in a data frame) are told by one key-set comparison each."""
    keys = header.keys()
    if keys != _RESULT_KEYS and not _RESULT_REQUIRED <= keys <= _RESULT_KEYS:
        return None
    items = header["responses"]
    if type(items) is not list:
        return None
    for i, item in enumerate(items):
        response = _response_item_fast(item)
        if response is None:
            return None
        items[i] = response
    message = _new(ExecuteResult)
    message.__dict__ = header
    return message


def _response_item_fast(item: Any) -> Optional[ResponseItem]:
    """One response of an ExecuteResult or a StreamResponse, built on the decoded dict itself; None when it is
    not what the worker's writers write (the caller then goes to the generic decoder)."""
    if type(item) is not dict:
        return None
    if item.keys() == _PLAIN_ITEM_KEYS:  # no error, no parameters: the common answer (a token, a result)
        refs = item["outputs"]
        if type(refs) is not list:
            return None
        item["parameters"] = {}
    elif not _response_fields(item):
        return None
    else:
        refs = item["outputs"]
    if not _tensor_refs(refs):
        return None
    response = _new(ResponseItem)
    response.__dict__ = item
    return response


def _stream_response_fast(header: dict[str, Any]) -> Optional[StreamResponse]:
    """A StreamResponse as the worker writes one (`stream_response_header`: every field), built in one pass as
    `_execute_result_fast` builds its items (the supervisor reads one per streamed response): None may leave
    `header` half changed, and `decode_header` parses the frame again for `_build`."""
    if header.keys() != _STREAM_KEYS:
        return None
    item = header["response"]
    if item is not None:
        response = _response_item_fast(item)
        if response is None:
            return None
        header["response"] = response
    message = _new(StreamResponse)
    message.__dict__ = header
    return message


def _response_fields(item: dict[str, Any]) -> bool:
    """An ExecuteResult's item other than request_id + outputs checked, its error built and its defaults
    filled in (outputs [], parameters {}); False for anything `_build` should judge."""
    if not item.keys() <= _RESPONSE_KEYS or "request_id" not in item:
        return False
    refs = item.get("outputs")
    if refs is None and "outputs" not in item:
        item["outputs"] = []
    elif type(refs) is not list:
        return False
    error = item.get("error")
    if error is not None:
        if type(error) is not dict or error.keys() != _ERROR_KEYS:
            return False
        wire_error = item["error"] = _new(WireError)
        wire_error.__dict__ = error
    if "parameters" not in item:
        item["parameters"] = {}
    return True


def _columns_in_place(items: Any) -> bool:
    """A header's list of column fields turned into TensorColumns in place; False (nothing changed) unless
    every item holds exactly a column's fields."""
    if type(items) is not list:
        return False
    for fields in items:
        if type(fields) is not dict or fields.keys() != _COLUMN_KEYS:
            return False
    new = _new
    for i, fields in enumerate(items):
        column = items[i] = new(TensorColumn)
        column.__dict__ = fields
    return True


def _execute_result_columns_fast(header: dict[str, Any]) -> Optional[ExecuteResultColumns]:
    """An ExecuteResultColumns as the worker sends it (`execute_result_columns_header`)."""
    if not _COLUMNS_RESULT_REQUIRED <= header.keys() <= _COLUMNS_RESULT_KEYS:
        return None
    if not _columns_in_place(header["outputs"]):
        return None
    message = _new(ExecuteResultColumns)
    message.__dict__ = header
    return message


def decode_execute_result_columns(header: dict[str, Any]) -> Optional[ExecuteResultColumns]:
    """`decode_header`'s message of an ExecuteResultColumns header as parsed (its "t" included), for a
    reader that parsed it already; None (`header` unchanged) for anything the generic decoder should
    judge."""
    tag = header.pop("t")
    message = _execute_result_columns_fast(header)
    if message is None:
        header["t"] = tag
    return message


_EXECUTE_COLUMNS_KEYS = frozenset(_field_names(ExecuteColumns))
_EXECUTE_COLUMNS_REQUIRED = _required(ExecuteColumns)
_EXECUTE_COLUMNS_LISTS = tuple(sorted(_EXECUTE_COLUMNS_KEYS - _EXECUTE_COLUMNS_REQUIRED - {"poll_us"}))  # default []


def _execute_columns_fast(header: dict[str, Any]) -> Optional[ExecuteColumns]:
    """An ExecuteColumns as the supervisor sends it (`execute_columns_header`; the worker reads one per batch):
    its optional fields (lists) filled in where left out."""
    if not _EXECUTE_COLUMNS_REQUIRED <= header.keys() <= _EXECUTE_COLUMNS_KEYS:
        return None
    if type(header.get("poll_us", 0)) is not int:  # checked before anything changes: `_build` reads `header` next
        return None
    if not _columns_in_place(header["inputs"]):
        return None
    for name in _EXECUTE_COLUMNS_LISTS:
        if name not in header:
            header[name] = []
    header.setdefault("poll_us", 0)
    message = _new(ExecuteColumns)
    message.__dict__ = header
    return message


_FAST_DECODERS: dict[type[Any], Callable[[dict[str, Any]], Any]] = {
    Execute: _execute_fast,
    ExecuteColumns: _execute_columns_fast,
    ExecuteResult: _execute_result_fast,
    ExecuteResultColumns: _execute_result_columns_fast,
    StreamResponse: _stream_response_fast,
}
