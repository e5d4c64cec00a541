"""Typed messages between the supervisor and a worker, and their framing.

A message travels as ZeroMQ frames: frame 0 is a JSON header `{"t": <type tag>, ...fields}`, the
following frames carry inline tensor bytes referenced by index. Larger tensors live in POSIX shared
memory and are referenced by (region, offset, nbytes). No pickle: every message is one of the
dataclasses below, decoded by its tag into that class; unknown tags or fields are a protocol error.

Runs on Python 3.9+ (worker environments), so no `match`, no slots=, no `X | Y` at runtime.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

WIRE_VERSION = 1

# Tensors at or below this many bytes ride as ZeroMQ frames; larger ones go through shared memory.
INLINE_MAX_BYTES = 64 * 1024


@dataclass
class TensorRef:
    """Where a tensor's bytes are: `loc` is "frame" (index into the message frames) or "shm"."""

    name: str
    datatype: str
    shape: list[int]
    loc: str = "frame"
    frame: int = -1
    region: str = ""
    offset: int = 0
    nbytes: int = 0


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


@dataclass
class ExecuteResult:
    batch_id: int
    responses: list[ResponseItem]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


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


@dataclass
class Execute:
    batch_id: int
    requests: list[RequestItem]
    # shm regions the supervisor has unlinked since the last Execute: unmap them if cached
    forget_regions: list[str] = field(default_factory=list)


@dataclass
class Cancel:
    request_ids: list[int]


@dataclass
class Shutdown:
    pass


# ---- both ways ------------------------------------------------------------------------------


@dataclass
class Heartbeat:
    seq: int = 0


MESSAGE_TYPES: dict[str, type[Any]] = {
    "hello": Hello,
    "autocomplete_result": AutoCompleteResult,
    "load_result": LoadResult,
    "execute_result": ExecuteResult,
    "log": Log,
    "bye": Bye,
    "autocomplete": AutoComplete,
    "load_model": LoadModel,
    "execute": Execute,
    "cancel": Cancel,
    "shutdown": Shutdown,
    "heartbeat": Heartbeat,
}
TAGS: dict[type[Any], str] = {cls: tag for tag, cls in MESSAGE_TYPES.items()}


class ProtocolError(Exception):
    """A peer sent something that is not a valid message of this wire version."""


def encode(message: Any, frames: Sequence[Any] = ()) -> list[Any]:
    """Frames for `message`: a JSON header then the given data frames (buffers, sent zero-copy)."""
    header = _plain(message)
    header["t"] = TAGS[type(message)]
    return [json.dumps(header, separators=(",", ":")).encode(), *frames]


def decode(frames: Sequence[Any]) -> tuple[Any, Sequence[Any]]:
    """(message, data frames) from received frames; raises ProtocolError on anything malformed."""
    if not frames:
        raise ProtocolError("empty message")
    first = frames[0]
    raw = first.bytes if hasattr(first, "bytes") else bytes(first)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise TypeError("message header is not a JSON object")
        cls = MESSAGE_TYPES[header.pop("t")]
        return _build(cls, header), frames[1:]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ProtocolError("malformed message: %s" % exc) from None


_NESTED = {
    (RequestItem, "inputs"): TensorRef,
    (ResponseItem, "outputs"): TensorRef,
    (Execute, "requests"): RequestItem,
    (ExecuteResult, "responses"): ResponseItem,
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
        kwargs[key] = value
    return cls(**kwargs)
