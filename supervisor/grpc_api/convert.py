"""ModelInferRequest -> core InferRequest and core InferResponse -> ModelInferResponse.

A request reaches `to_core` as a `ParsedRequest`: plain Python values, built either by the
hand-written wire parser (`wire.parse_request`, the hot path) or from a protobuf message
(`from_message`, for everything the fast parser leaves to protobuf). Both share every check below.

Tensor bytes stay in wire form: `raw_input_contents[i]` (bytes, or a memoryview into the received
message) is passed on as is. Every size the client declares is checked against the bytes it
actually sent before anything is allocated from it (reference/reliability.md D6).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import invalid_arg

from ..core.classification import CLASSIFICATION_WITH_SHM
from ..core.dataplane import DataPlane
from ..inference.limits import MAX_DIMS, MAX_PARAMETERS, MAX_TENSORS
from ..inference.types import SEQUENCE_END, SEQUENCE_START, InferRequest, RequestedOutput, Tensor

MAX_CORRELATION_ID_CHARS = 128  # Triton's limit for string sequence ids

_LEN = struct.Struct("<I")

# datatype -> (InferTensorContents field, dtype of that field's values); FP16/BF16 have none
_CONTENTS: dict[str, tuple[str, np.dtype | None]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype("<i4")),
    "INT16": ("int_contents", np.dtype("<i4")),
    "INT32": ("int_contents", np.dtype("<i4")),
    "INT64": ("int64_contents", np.dtype("<i8")),
    "UINT8": ("uint_contents", np.dtype("<u4")),
    "UINT16": ("uint_contents", np.dtype("<u4")),
    "UINT32": ("uint_contents", np.dtype("<u4")),
    "UINT64": ("uint64_contents", np.dtype("<u8")),
    "FP32": ("fp32_contents", np.dtype("<f4")),
    "FP64": ("fp64_contents", np.dtype("<f8")),
    "BYTES": ("bytes_contents", None),
}

PARSE_ERROR = "failed to parse the request message"


class BadRequest:
    """What the deserializer returns for bytes that do not decode; handlers answer INVALID_ARGUMENT."""

    __slots__ = ()


BAD = BadRequest()


def deserializer(cls: Any) -> Callable[[bytes], Any]:
    from_string = cls.FromString

    def decode(data: bytes) -> Any:
        try:
            return from_string(data)
        except Exception:  # DecodeError, RecursionError on deep nesting, ...: never echo parser internals
            return BAD

    return decode


class ShmOutputs(dict[str, tuple[str, int, int]]):
    """shm output name -> (region, offset, byte_size); `hold` keeps the request's regions held until its
    outputs are written (memory.client_shm.ShmHold)."""

    __slots__ = ("hold",)

    def __init__(self) -> None:
        super().__init__()
        self.hold: Any = None

# one InferParameter: (name of the oneof member that is set, or None; its value)
Param = tuple[str | None, Any]
Params = dict[str, Param]


@dataclass(slots=True)
class ParsedInput:
    name: str = ""
    datatype: str = ""
    shape: list[int] = field(default_factory=list)
    parameters: Params = field(default_factory=dict)
    contents: Any = None  # the InferTensorContents message when the request has one (protobuf path)


@dataclass(slots=True)
class ParsedOutput:
    name: str = ""
    parameters: Params = field(default_factory=dict)


@dataclass(slots=True)
class ParsedRequest:
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    parameters: Params = field(default_factory=dict)
    inputs: list[ParsedInput] = field(default_factory=list)
    outputs: list[ParsedOutput] = field(default_factory=list)
    raw: list[Any] = field(default_factory=list)  # raw_input_contents: bytes or memoryviews


def _params_of(params: Any) -> Params:
    out: Params = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = (which, getattr(p, which) if which is not None else None)
    return out


def from_message(msg: pb.ModelInferRequest) -> ParsedRequest:
    """The protobuf path: a parsed ModelInferRequest message as a ParsedRequest."""
    inputs = [
        ParsedInput(
            t.name,
            t.datatype,
            list(t.shape),
            _params_of(t.parameters) if t.parameters else {},
            t.contents if t.HasField("contents") else None,
        )
        for t in msg.inputs
    ]
    outputs = [ParsedOutput(o.name, _params_of(o.parameters) if o.parameters else {}) for o in msg.outputs]
    return ParsedRequest(
        msg.model_name,
        msg.model_version,
        msg.id,
        _params_of(msg.parameters) if msg.parameters else {},
        inputs,
        outputs,
        list(msg.raw_input_contents),
    )


def param_value(p: Param, what: str) -> Any:
    if p[0] is None:
        raise invalid_arg(f"parameter '{what}' has no value")
    return p[1]


def _int_param(p: Param, what: str) -> int:
    if p[0] not in ("int64_param", "uint64_param"):
        raise invalid_arg(f"invalid value type for '{what}' parameter, expected int64_param")
    return int(p[1])


def _request_parameters(params: Params, req: InferRequest) -> None:
    if len(params) > MAX_PARAMETERS:
        raise invalid_arg(f"too many request parameters ({len(params)} > {MAX_PARAMETERS})")
    custom = req.parameters
    for key, (which, value) in params.items():
        if key == "sequence_id":
            if which == "int64_param":
                req.correlation_id = value
            elif which == "string_param":
                if len(value) > MAX_CORRELATION_ID_CHARS:
                    raise invalid_arg(f"string sequence_id must be at most {MAX_CORRELATION_ID_CHARS} characters")
                req.correlation_id = value
            else:
                raise invalid_arg(
                    "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
                )
        elif key == "sequence_start" or key == "sequence_end":
            if which != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param")
            if value:
                req.flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
        elif key == "priority":
            if (which == "int64_param" and value >= 0) or which == "uint64_param":
                req.priority = value
            else:
                raise invalid_arg("invalid value for 'priority' parameter, expected non-negative int64_param or uint64")
        elif key == "timeout":
            if which != "int64_param" or value < 0:
                raise invalid_arg("invalid value for 'timeout' parameter, expected non-negative int64_param")
            req.timeout_us = value
        elif key == "triton_enable_empty_final_response":
            if which != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param")
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
            )
        elif which is None:
            raise invalid_arg(f"parameter '{key}' has no value")
        else:
            custom[key] = value


def check_bytes_framing(buf: Any, count: int, name: str) -> None:
    """A BYTES buffer must hold exactly `count` length-prefixed elements, no more, no less."""
    total = len(buf)
    if count * 4 > total:
        raise invalid_arg(f"input '{name}' declares {count} BYTES elements but has only {total} bytes of data")
    unpack = _LEN.unpack_from
    pos = 0
    n = 0
    while pos + 4 <= total and n < count:
        pos += 4 + unpack(buf, pos)[0]
        n += 1
    if n != count or pos != total:
        raise invalid_arg(f"input '{name}' BYTES data does not hold exactly {count} length-prefixed elements")


def _typed_contents(t: ParsedInput, datatype: str, count: int) -> bytes:
    entry = _CONTENTS.get(datatype)
    if entry is None:
        raise invalid_arg(f"input '{t.name}': datatype {datatype} cannot use typed contents, send raw bytes")
    field, src = entry
    values = getattr(t.contents, field)
    if len(values) != count:
        raise invalid_arg(
            f"input '{t.name}' has {len(values)} elements in {field} but its shape {list(t.shape)} needs {count}"
        )
    if src is None:
        return b"".join(_LEN.pack(len(v)) + v for v in values)
    target = BY_NAME[datatype].numpy
    # narrow types travel widened (int32/uint32); cast like a C conversion
    return np.asarray(values, dtype=src).astype(target, copy=False).tobytes()


def _region(params: Params, name: str) -> str:
    which, value = params["shared_memory_region"]
    if which != "string_param":
        raise invalid_arg(f"'{name}': 'shared_memory_region' must be a string_param")
    return str(value)


def _shm_size_offset(params: Params, what: str) -> tuple[int, int]:
    """The byte size (required) and offset (default 0) of a tensor in a shm region. A negative one is left
    to the region's check, which reads it as Triton does: unsigned, so out of bounds with Triton's words."""
    if "shared_memory_byte_size" not in params:
        raise invalid_arg(f"{what}: 'shared_memory_byte_size' is required with a shm region")
    byte_size = _int_param(params["shared_memory_byte_size"], "shared_memory_byte_size")
    offset = (
        _int_param(params["shared_memory_offset"], "shared_memory_offset") if "shared_memory_offset" in params else 0
    )
    return byte_size, offset


def _shm_input(t: ParsedInput, count: int, itemsize: int, dataplane: DataPlane) -> Any:
    params = t.parameters
    region = _region(params, t.name)
    byte_size, offset = _shm_size_offset(params, f"input '{t.name}'")
    if t.contents is not None:
        raise invalid_arg(f"input '{t.name}' cannot give both shared memory and typed contents")
    dataplane.shm_check(region, offset, byte_size)  # (Triton checks the window before the size)
    if itemsize and byte_size != count * itemsize:
        raise invalid_arg(
            f"input '{t.name}': shared memory byte size {byte_size} does not match "
            f"{count} elements of {t.datatype} ({count * itemsize} bytes)"
        )
    return dataplane.shm_read(region, offset, byte_size, bool(itemsize))  # BYTES: host bytes


def to_core(msg: ParsedRequest, dataplane: DataPlane) -> tuple[InferRequest, ShmOutputs | None]:
    """Build the core request; returns it with the outputs to be written to shared memory."""
    req = InferRequest(msg.model_name, msg.model_version, msg.id)
    if msg.parameters:
        _request_parameters(msg.parameters, req)
    raw = msg.raw
    n_raw = len(raw)
    if len(msg.inputs) > MAX_TENSORS or len(msg.outputs) > MAX_TENSORS:
        raise invalid_arg(f"too many inputs or outputs (limit {MAX_TENSORS})")
    raw_idx = 0
    inputs = req.inputs
    regions: list[str] = []  # the shm regions it names, held while it is in flight
    for t in msg.inputs:
        name = t.name
        datatype = t.datatype
        dt = BY_NAME.get(datatype)
        if dt is None:
            raise invalid_arg(f"input '{name}' has an invalid datatype '{datatype}'")
        shape = t.shape
        if len(shape) > MAX_DIMS:
            raise invalid_arg(f"input '{name}' has {len(shape)} dimensions, at most {MAX_DIMS} are allowed")
        count = 1
        for d in shape:
            if d < 0:
                raise invalid_arg(f"input '{name}' has a negative dimension in shape {shape}")
            count *= d  # Python ints: a huge product cannot overflow, it just fails the size check
        itemsize = dt.itemsize
        tparams = t.parameters
        if tparams and "shared_memory_region" in tparams:
            data = _shm_input(t, count, itemsize, dataplane)
            regions.append(_region(tparams, name))
            if not itemsize:
                check_bytes_framing(data, count, name)
        elif t.contents is not None:
            if n_raw:
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for '{name}' "
                    f"for model '{msg.model_name}'"
                )
            data = _typed_contents(t, datatype, count)
        else:
            if raw_idx >= n_raw:
                raise invalid_arg(
                    f"unable to find data for input tensor '{name}' for model '{msg.model_name}' in request."
                )
            data = raw[raw_idx]
            raw_idx += 1
            if itemsize:
                if len(data) != count * itemsize:
                    raise invalid_arg(
                        f"input byte size mismatch for input '{name}' for model '{msg.model_name}'. "
                        f"Expected {count * itemsize}, got {len(data)}"
                    )
            else:
                check_bytes_framing(data, count, name)
        tensor = Tensor(name, datatype, list(shape), data)  # its own: a parsed head is shared (wire.py)
        if tparams:
            for k, p in tparams.items():
                if not k.startswith("shared_memory_"):
                    tensor.parameters[k] = param_value(p, k)
        inputs.append(tensor)
    if raw_idx != n_raw:
        raise invalid_arg(f"got {n_raw} raw_input_contents entries but {raw_idx} inputs use raw data")
    shm_out: ShmOutputs | None = None
    asked: set[str] = set()
    for o in msg.outputs:
        out = RequestedOutput(o.name)
        region = None
        if o.parameters:
            if "classification" in o.parameters and "shared_memory_region" in o.parameters:
                raise invalid_arg(CLASSIFICATION_WITH_SHM)
            for k, p in o.parameters.items():
                if k == "shared_memory_region":
                    region = _shm_output(o)
                elif k.startswith("shared_memory_") or k == "binary_data":
                    continue  # consumed with the region / meaningless over gRPC
                elif k == "classification":
                    out.parameters[k] = _class_count(p)
                else:
                    out.parameters[k] = param_value(p, k)
        if o.name in asked:
            continue  # an output asked for again: Triton keeps the first request of it
        asked.add(o.name)
        if region is not None:
            dataplane.shm_check(*region)
            regions.append(region[0])
            shm_out = shm_out if shm_out is not None else ShmOutputs()
            shm_out[o.name] = region
        req.outputs.append(out)
    if regions:
        # held until the outputs are written (the servicer lets go then), or the request is collected
        shm_out = shm_out if shm_out is not None else ShmOutputs()
        req.shm_hold = shm_out.hold = dataplane.shm_hold(regions)
    if shm_out and len(shm_out) == len(req.outputs) and all(dataplane.shm_is_cuda(r) for r, _, _ in shm_out.values()):
        req.device_outputs = True  # every output goes to a CUDA region: a GPU model's go device to device
    return req, shm_out


def _class_count(p: Param) -> int:
    """A requested output's classification: an int64_param above 0, as Triton's gRPC frontend checks."""
    if p[0] != "int64_param":
        raise invalid_arg("invalid value type for 'classification' parameter, expected int64_param")
    if p[1] <= 0:
        raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
    return int(p[1])


def _shm_output(o: ParsedOutput) -> tuple[str, int, int]:
    params = o.parameters
    size, offset = _shm_size_offset(params, f"output '{o.name}'")
    return _region(params, o.name), offset, size
