"""Hand-written protobuf wire codec for the inference hot path (ModelInfer, ModelStreamInfer).

Why: with protobuf messages, a 4 MiB tensor was copied out of the parsed request, copied into
`raw_output_contents`, and copied again (into a repeatedly grown buffer) when the response was
serialized; for small requests the message objects cost more than the data. Here:

- `parse_request` reads a ModelInferRequest straight from the received bytes into a
  `ParsedRequest`; `raw_input_contents` entries are memoryview slices of those bytes (no copy).
  Anything it does not expect (typed `contents`, unknown fields, odd wire types, bad UTF-8,
  truncation, more tensors or parameters than the limits) makes it give up, and `decode_request`
  hands the bytes to protobuf instead, so every unusual message behaves exactly as before.
- `encode_response` writes a ModelInferResponse: small header fields first, then each output
  tensor as tag + length + its bytes, joined once, so an output is copied exactly once.

Field numbers: reference/triton.md §2.2 (protos/grpc_service.proto).
"""

from __future__ import annotations

import struct
from typing import Any

from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.worker.wire.errors import invalid_arg

from ..core.dataplane import DataPlane
from ..inference.limits import MAX_PARAMETERS, MAX_TENSORS
from ..inference.types import InferResponse
from .convert import (
    BAD,
    BadRequest,
    Param,
    Params,
    ParsedInput,
    ParsedOutput,
    ParsedRequest,
    ShmOutputs,
    from_message,
)

_MASK64 = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_DOUBLE = struct.Struct("<d")


class _Unusual(Exception):
    """The fast parser gives up on this message; protobuf parses it instead."""


# ---------------------------------------------------------------------------------------------
# parsing


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]  # IndexError when truncated: caught by decode_request
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > _MASK64:
                raise _Unusual
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unusual


def _signed(v: int) -> int:
    return v - (1 << 64) if v > _INT64_MAX else v


def _span(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Length prefix at `pos` -> (start, stop) of the payload, which must end by `end`."""
    b = buf[pos]
    if b < 0x80:
        pos += 1
        stop = pos + b
    else:
        n, pos = _varint(buf, pos)
        stop = pos + n
    if stop > end:
        raise _Unusual
    return pos, stop


def _parameter(buf: bytes, pos: int, end: int, prev: Param) -> Param:
    """One InferParameter merged into `prev` (what earlier occurrences of the entry's value gave):
    protobuf merges repeated occurrences of a message field, so a member set before stays set unless
    this occurrence sets one (the last member set wins)."""
    which, value = prev
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag == 0x08:
            v, pos = _varint(buf, pos)
            which, value = "bool_param", v != 0
        elif tag == 0x10:
            v, pos = _varint(buf, pos)
            which, value = "int64_param", _signed(v)
        elif tag == 0x1A:
            a, pos = _span(buf, pos, end)
            which, value = "string_param", buf[a:pos].decode()
        elif tag == 0x21:
            if pos + 8 > end:
                raise _Unusual
            which, value = "double_param", _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif tag == 0x28:
            v, pos = _varint(buf, pos)
            which, value = "uint64_param", v
        else:
            raise _Unusual
    if pos != end:
        raise _Unusual
    return which, value


def _map_entry(buf: bytes, pos: int, end: int, into: Params) -> None:
    """One map<string, InferParameter> entry; a repeated key replaces the earlier one. Inside the entry the
    last key wins and repeated values merge, as protobuf parses them."""
    key = ""
    value: Param = (None, None)
    while pos < end:
        tag = buf[pos]
        pos += 1
        a, pos = _span(buf, pos, end)
        if tag == 0x0A:
            key = buf[a:pos].decode()
        elif tag == 0x12:
            value = _parameter(buf, a, pos, value)
        else:
            raise _Unusual
    if len(into) >= MAX_PARAMETERS and key not in into:
        raise _Unusual  # protobuf's path reports the limit
    into[key] = value


def _input(buf: bytes, pos: int, end: int) -> ParsedInput:
    name = datatype = ""
    shape: list[int] = []
    params: Params = {}
    while pos < end:
        tag = buf[pos]
        if tag == 0x18:  # one unpacked shape value
            v, pos = _varint(buf, pos + 1)
            shape.append(_signed(v))
            continue
        n = buf[pos + 1]  # the length prefix, inline when it is one byte
        if n < 0x80:
            a = pos + 2
            pos = a + n
            if pos > end:
                raise _Unusual
        else:
            a, pos = _span(buf, pos + 1, end)
        if tag == 0x0A:
            name = buf[a:pos].decode()
        elif tag == 0x12:
            datatype = buf[a:pos].decode()
        elif tag == 0x1A:  # packed shape
            while a < pos:
                b = buf[a]
                if b < 0x80:
                    shape.append(b)
                    a += 1
                else:
                    v, a = _varint(buf, a)
                    shape.append(_signed(v))
            if a != pos:
                raise _Unusual
        elif tag == 0x22:
            _map_entry(buf, a, pos, params)
        else:  # 0x2A typed contents, or anything unknown
            raise _Unusual
    if pos != end:
        raise _Unusual
    return ParsedInput(name, datatype, shape, params)


def _output(buf: bytes, pos: int, end: int) -> ParsedOutput:
    o = ParsedOutput()
    while pos < end:
        tag = buf[pos]
        pos += 1
        a, pos = _span(buf, pos, end)
        if tag == 0x0A:
            o.name = buf[a:pos].decode()
        elif tag == 0x12:
            _map_entry(buf, a, pos, o.parameters)
        else:
            raise _Unusual
    return o


def parse_request(data: bytes) -> ParsedRequest | None:
    """The common ModelInferRequest without protobuf; None = leave it to protobuf."""
    try:
        return _parse_headed(data) or _parse(data)
    except Exception:  # _Unusual, IndexError (truncated), UnicodeDecodeError, ...
        return None


# A client sends the same fields before its tensors' bytes on every call (model, inputs, outputs, in field
# order, raw_input_contents last): those bytes are parsed once, and every request that starts with them shares
# that parse's parameters, inputs and outputs (read only: to_core copies what it keeps). Bounded: cleared
# when full.
HEAD_CACHE = 256
HEAD_CACHE_BYTES = 2048  # longer heads are parsed each time
_heads: dict[bytes, ParsedRequest] = {}


def _parse_headed(buf: bytes) -> ParsedRequest | None:
    """A request whose raw_input_contents all come after its other fields, with that head parsed once
    (_parse of the head bytes: the same values _parse gives for the whole message). None: parse it all."""
    if type(buf) is not bytes:
        return None
    end = len(buf)
    pos = 0
    while pos < end:  # the head: every field up to the first raw_input_contents
        tag = buf[pos]
        if tag == 0x3A:
            break
        if tag & 7 != 2:
            raise _Unusual
        n = buf[pos + 1]
        if n < 0x80:
            pos += 2 + n
        else:
            pos = _span(buf, pos + 1, end)[1]
    if pos > HEAD_CACHE_BYTES or pos > end:
        return None
    prefix = buf[:pos]
    head = _heads.get(prefix)
    if head is None:
        head = _parse(prefix)
        if len(_heads) >= HEAD_CACHE:
            _heads.clear()
        _heads[prefix] = head
    view = memoryview(buf)
    raw = []
    while pos < end:
        if buf[pos] != 0x3A:
            return None  # other fields after the tensors' bytes: not the common order
        n = buf[pos + 1]
        if n < 0x80:
            a = pos + 2
            pos = a + n
            if pos > end:
                raise _Unusual
        else:
            a, pos = _span(buf, pos + 1, end)
        raw.append(view[a:pos])
    return ParsedRequest(head.model_name, head.model_version, head.id, head.parameters, head.inputs, head.outputs, raw)


def _parse(buf: bytes) -> ParsedRequest:
    if type(buf) is not bytes and type(buf) is not bytearray:  # a bytearray: a message of many DATA frames
        raise _Unusual
    view = memoryview(buf)
    end = len(buf)
    req = ParsedRequest()
    raw = req.raw
    pos = 0
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag & 7 != 2:  # every field of ModelInferRequest is length-delimited
            raise _Unusual
        a, pos = _span(buf, pos, end)
        if tag == 0x3A:
            raw.append(view[a:pos])
        elif tag == 0x2A:
            req.inputs.append(_input(buf, a, pos))
            if len(req.inputs) > MAX_TENSORS:
                raise _Unusual
        elif tag == 0x0A:
            req.model_name = buf[a:pos].decode()
        elif tag == 0x32:
            req.outputs.append(_output(buf, a, pos))
            if len(req.outputs) > MAX_TENSORS:
                raise _Unusual
        elif tag == 0x12:
            req.model_version = buf[a:pos].decode()
        elif tag == 0x1A:
            req.id = buf[a:pos].decode()
        elif tag == 0x22:
            _map_entry(buf, a, pos, req.parameters)
        else:
            raise _Unusual
    return req


_from_string = pb.ModelInferRequest.FromString


def decode_request(data: bytes) -> ParsedRequest | BadRequest:
    """The request deserializer: fast path, else protobuf; BAD for bytes that do not decode."""
    try:
        parsed = _parse_headed(data) or _parse(data)  # parse_request, one call less
    except Exception:
        parsed = None
    if parsed is not None:
        return parsed
    try:
        return from_message(_from_string(data))
    except Exception:  # DecodeError, RecursionError on deep nesting, ...: never echo parser internals
        return BAD


# ---------------------------------------------------------------------------------------------
# encoding

_SMALL = [bytes((i,)) for i in range(128)]
_RAW_TAGS = [b"\x32" + b for b in _SMALL]  # raw_output_contents tag + a one-byte length


def _uvarint(v: int) -> bytes:
    if v < 0x80:
        return _SMALL[v]
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _int64(v: Any) -> bytes:
    if type(v) is not int:
        v = v.__index__()  # numpy integers; a float is refused like protobuf refuses it
    if 0 <= v < 0x80:
        return _SMALL[v]
    if v < _INT64_MIN or v > _INT64_MAX:
        raise ValueError(f"value out of range for int64: {v}")
    return _uvarint(v & _MASK64)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _uvarint(len(payload)) + payload


def _param_value(v: Any) -> bytes:
    """One InferParameter, with the member chosen like set_parameters always did (bool before int)."""
    if isinstance(v, bool):
        return b"\x08\x01" if v else b"\x08\x00"
    if isinstance(v, int):
        if v > _INT64_MAX:
            if v > _MASK64:
                raise ValueError(f"value out of range for uint64: {v}")
            return b"\x28" + _uvarint(v)
        return b"\x10" + _int64(v)
    if isinstance(v, float):
        return b"\x21" + _DOUBLE.pack(v)
    s = bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)
    return _field(b"\x1a", s.encode())


def _parameters(values: dict[str, Any]) -> bytes:
    """map<string, InferParameter> entries (field 4 in both the response and its outputs)."""
    out = bytearray()
    for k, v in values.items():
        entry = _field(b"\x0a", k.encode()) + _field(b"\x12", _param_value(v))
        out += b"\x22" + _uvarint(len(entry)) + entry
    return bytes(out)


def _output_tensor(name: str, datatype: str, shape: list[int], params: dict[str, Any]) -> bytes:
    body = bytearray()
    if name:
        body += _field(b"\x0a", name.encode())
    if datatype:
        body += _field(b"\x12", datatype.encode())
    if shape:
        body += _field(b"\x1a", b"".join([_int64(d) for d in shape]))
    if params:
        body += _parameters(params)
    return _field(b"\x2a", bytes(body))


# Header bytes for the (model, version) pair and for parameter-less output tensors repeat from one
# response to the next: keep them, up to a bound (cleared when full; rebuilding is cheap).
_CACHE_MAX = 4096
_model_heads: dict[tuple[str, str], bytes] = {}
_output_heads: dict[tuple[Any, ...], bytes] = {}


def _model_head(name: str, version: str) -> bytes:
    key = (name, version)
    head = _model_heads.get(key)
    if head is None:
        head = (_field(b"\x0a", name.encode()) if name else b"") + (
            _field(b"\x12", version.encode()) if version else b""
        )
        if len(_model_heads) >= _CACHE_MAX:
            _model_heads.clear()
        _model_heads[key] = head
    return head


def _plain_output_head(name: str, datatype: str, shape: list[int]) -> bytes:
    key = (name, datatype, *shape)
    head = _output_heads.get(key)
    if head is None:
        head = _output_tensor(name, datatype, shape, {})
        if len(_output_heads) >= _CACHE_MAX:
            _output_heads.clear()
        _output_heads[key] = head
    return head


def response_parts(
    resp: InferResponse,
    shm_out: ShmOutputs | None,
    dataplane: DataPlane,
    extra: dict[str, Any] | None = None,
) -> tuple[list[Any], int]:
    """A ModelInferResponse as byte pieces (outputs as memoryviews, not copied) and their total size.

    Every output gets outputs[i] and raw_output_contents[i] (empty for shm outputs, which are
    written to their region here). `extra` parameters override the response's own.
    """
    head = _model_heads.get((resp.model_name, resp.model_version))
    parts: list[Any] = [head if head is not None else _model_head(resp.model_name, resp.model_version)]
    if resp.id:
        parts.append(_field(b"\x1a", resp.id.encode()))
    params = resp.parameters
    if extra:
        params = {**params, **extra} if params else extra
    if params:
        parts.append(_parameters(params))
    tail: list[Any] = []
    for t in resp.outputs:
        if t.parameters:
            parts.append(_output_tensor(t.name, t.datatype, t.shape, t.parameters))
        else:
            out_head = _output_heads.get((t.name, t.datatype, *t.shape))
            parts.append(out_head if out_head is not None else _plain_output_head(t.name, t.datatype, t.shape))
        data = t.data
        shm = shm_out.get(t.name) if shm_out else None
        if shm is not None:
            region, offset, limit = shm
            if t.device_ref is not None:  # a device output (asked for only when every output is in a CUDA region)
                data = t.device_ref
                nbytes = data.nbytes
            else:
                nbytes = memoryview(data).nbytes
            if nbytes > limit:
                raise invalid_arg(
                    f"shared memory size specified with the request for output '{t.name}' ({limit} bytes) "
                    f"should be at least {nbytes} bytes to hold the results"
                )
            dataplane.shm_write(region, offset, data)
            tail.append(b"\x32\x00")
            continue
        if type(data) is not bytes:
            view = memoryview(data)
            if not view.c_contiguous:
                data = view.tobytes()
            elif view.format != "B" or view.ndim != 1:
                data = view.cast("B") if view.nbytes else b""  # cast refuses a shape with a 0 in it
            else:
                data = view
        n = len(data)
        tail.append(_RAW_TAGS[n] if n < 0x80 else b"\x32" + _uvarint(n))
        tail.append(data)
    parts += tail
    return parts, sum(map(len, parts))


def encode_response(resp: InferResponse, shm_out: ShmOutputs | None, dataplane: DataPlane) -> bytes:
    """A serialized ModelInferResponse."""
    parts, _ = response_parts(resp, shm_out, dataplane)
    return b"".join(parts)


def encode_stream_response(
    resp: InferResponse, shm_out: ShmOutputs | None, dataplane: DataPlane, extra: dict[str, Any]
) -> bytes:
    """A serialized ModelStreamInferResponse carrying `resp` as its infer_response."""
    parts, size = response_parts(resp, shm_out, dataplane, extra)
    return b"".join([b"\x12" + _uvarint(size), *parts])


def encode_stream_error(message: str) -> bytes:
    """A serialized ModelStreamInferResponse carrying only error_message."""
    return _field(b"\x0a", message.encode()) if message else b""
