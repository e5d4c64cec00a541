"""config.pbtxt reading and normalisation (supervisor/repository/layout.py, config.py, normalize.py).

Reference: protobuf's own text_format on the generated ModelConfig, which the repository reader must follow
(accept and refuse the same texts, read the same values), refusing only with InferdError(INVALID_ARG):
a file that is not UTF-8, or a text protobuf refuses (with anything protobuf raises: ParseError, or another
exception on an input it cannot take) is the model's load error, never an exception of another type.

Then, for each config read: `normalize` either returns a config or refuses with InferdError; it is
idempotent (normalising its result changes nothing; the model manager runs it twice); and the JSON Triton
serves for it (`to_json_dict`) reads back through `parse_json_config` (the load API's config override) as
the same config, so a client can post back the config it was given.

Data: one mode byte, then
- 0: the bytes of config.pbtxt (seeds: every config of examples/ and tests/fixtures/models);
- 1: a ModelConfig built from the bytes field by field (every field of the schema reachable, enum numbers
  outside the enum, NaN and infinities, long and odd strings), written by text_format, a byte maybe changed.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Any

from _fdp import FDP, provider
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from inferd.supervisor._gen import model_config_pb2 as mc
from inferd.supervisor.repository import config as repo_config
from inferd.supervisor.repository import layout, normalize
from inferd.worker.wire.errors import ErrorCode, InferdError

MAX_LEN = 8192
NAME = "m"
_root = ""


class Finding(AssertionError):
    pass


def setup() -> None:
    """A repository holding model "m" with version 1 (a model.py in it, as a python model has)."""
    global _root
    _root = tempfile.mkdtemp(prefix="config-fuzz-")
    os.makedirs(os.path.join(_root, NAME, "1"))
    with open(os.path.join(_root, NAME, "1", "model.py"), "w") as f:
        f.write("class TritonPythonModel:\n    pass\n")


def _client_error(exc: InferdError, what: str) -> None:
    if exc.code != ErrorCode.INVALID_ARG:
        raise Finding(f"{what} refused with {exc!r}, not INVALID_ARG")


def reference(raw: bytes) -> mc.ModelConfig | None:
    """protobuf's reading of the file; None where it (or UTF-8) refuses it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except Exception:  # noqa: BLE001 - whatever protobuf raises, the reader must turn it into a load error
        return None
    return config


def same(a: mc.ModelConfig, b: mc.ModelConfig) -> bool:
    """Equal field for field (by bytes: NaN is equal to itself there), a NaN's sign aside: it means nothing, and
    the config's JSON ("NaN") does not carry it (found by the campaign: a `-nan` bucket read back as `nan`)."""
    return _canonical(a) == _canonical(b)


def _canonical(msg: Any) -> bytes:
    copy = type(msg)()
    copy.CopyFrom(msg)
    _positive_nans(copy)
    return copy.SerializeToString(deterministic=True)


def _positive_nans(msg: Any) -> None:
    for field, value in msg.ListFields():
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                items = value.values() if field.message_type.fields_by_name["value"].message_type else []
            else:
                items = [value] if hasattr(value, "ListFields") else value  # one message, or a repeated field
            for item in items:
                _positive_nans(item)
        elif field.cpp_type in (field.CPPTYPE_FLOAT, field.CPPTYPE_DOUBLE):
            if not isinstance(value, float):  # a repeated field
                value[:] = [math.nan if math.isnan(x) else x for x in value]
            elif math.isnan(value):
                setattr(msg, field.name, math.nan)


def check_file(raw: bytes) -> None:
    path = os.path.join(_root, NAME, "config.pbtxt")
    with open(path, "wb") as f:
        f.write(raw)
    want = reference(raw)
    try:
        source = layout.read_model(_root, NAME)
        got = repo_config.load_config(source)
    except InferdError as exc:
        _client_error(exc, "reading config.pbtxt")
        if want is not None:
            raise Finding(f"inferd refused a config protobuf reads ({exc.message}): {raw[:300]!r}") from None
        return
    if want is None:
        raise Finding(f"inferd read a config protobuf refuses: {raw[:300]!r}")
    if not same(got, want):
        raise Finding(f"inferd read {got} where protobuf read {want}")
    check_normalized(got, source)


def check_normalized(config: mc.ModelConfig, source: layout.ModelSource) -> None:
    try:
        once = normalize.normalize(config, source)
    except InferdError as exc:
        _client_error(exc, "normalize")
        return
    try:
        twice = normalize.normalize(once, source)
    except InferdError as exc:
        raise Finding(f"normalising a normalised config refuses it: {exc.message}\n{once}") from None
    if not same(once, twice):
        raise Finding(f"normalize is not idempotent:\n{once}\n---\n{twice}")
    rendered = repo_config.to_json(once)
    try:
        back = repo_config.parse_json_config(rendered)
    except InferdError as exc:
        raise Finding(f"the config's own JSON is refused by the load API ({exc.message}): {rendered[:400]}") from None
    if not same(back, once):
        raise Finding(f"the config's JSON reads back otherwise:\n{once}\n---\n{back}\n{rendered[:400]}")


# ---- configs from the bytes ----------------------------------------------------------------------------

_STRINGS = ["", "m", "INPUT0", "OUTPUT0", "python", "onnxruntime", "ensemble", "tensorrt_plan", "model.onnx",
            "$$TRITON_MODEL_DIRECTORY/env.tar.gz", "EXECUTION_ENV_PATH", "a b", "\u00e9", "x" * 300, "\\", "\"",
            "key_1", "__bad", "1", "-1", "true", "\x00", "\n"]


def _scalar(fdp: FDP, f: FieldDescriptor) -> Any:
    t = f.cpp_type
    if t == FieldDescriptor.CPPTYPE_BOOL:
        return fdp.ConsumeBool()
    if t == FieldDescriptor.CPPTYPE_STRING:
        return fdp.PickValueInList(_STRINGS)
    if t == FieldDescriptor.CPPTYPE_ENUM:
        numbers = [v.number for v in f.enum_type.values]
        return fdp.PickValueInList(numbers + ([99] if not f.enum_type.is_closed else []))
    if t in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        return fdp.PickValueInList([0.0, 1.5, -2.0, math.nan, math.inf, 1e-40, 3.4e38])
    bits = {FieldDescriptor.CPPTYPE_INT32: (-(1 << 31), (1 << 31) - 1),
            FieldDescriptor.CPPTYPE_UINT32: (0, (1 << 32) - 1),
            FieldDescriptor.CPPTYPE_INT64: (-(1 << 63), (1 << 63) - 1),
            FieldDescriptor.CPPTYPE_UINT64: (0, (1 << 64) - 1)}[t]
    if fdp.ConsumeBool():
        return fdp.PickValueInList([v for v in (-1, 0, 1, 2, 4, 8, 16) if bits[0] <= v <= bits[1]])
    return fdp.ConsumeIntInRange(*bits)


def fill(fdp: FDP, msg: Any, descriptor: Descriptor, depth: int = 0) -> None:
    fields = list(descriptor.fields)
    if not fields:
        return
    for _ in range(fdp.ConsumeIntInRange(0, 6 if depth == 0 else 3)):
        if not fdp.remaining_bytes():
            return
        f = fdp.PickValueInList(fields)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            key = _scalar(fdp, key_f)
            if value_f.message_type is not None:
                if depth < 4:
                    fill(fdp, getattr(msg, f.name)[key], value_f.message_type, depth + 1)
            else:
                getattr(msg, f.name)[key] = _scalar(fdp, value_f)
        elif f.message_type is not None:
            if depth >= 4:
                continue
            if f.is_repeated:
                fill(fdp, getattr(msg, f.name).add(), f.message_type, depth + 1)
            else:
                sub = getattr(msg, f.name)
                sub.SetInParent()
                fill(fdp, sub, f.message_type, depth + 1)
        elif f.is_repeated:
            getattr(msg, f.name).extend(_scalar(fdp, f) for _ in range(fdp.ConsumeIntInRange(0, 3)))
        else:
            setattr(msg, f.name, _scalar(fdp, f))


def built(fdp: FDP) -> bytes:
    config = mc.ModelConfig()
    if fdp.ConsumeBool():  # most configs that matter start like this
        config.name, config.backend, config.max_batch_size = NAME, "python", fdp.ConsumeIntInRange(0, 8)
        config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])
        config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])
    fill(fdp, config, mc.ModelConfig.DESCRIPTOR)
    raw = bytearray(text_format.MessageToString(config).encode())
    if raw and fdp.ConsumeIntInRange(0, 3) == 0:
        raw[fdp.ConsumeIntInRange(0, len(raw) - 1)] = fdp.PickValueInList(list(b"{}[]:\"\\#\n 0-xA\x00\xff"))
    return bytes(raw)


def test_one_input(data: bytes) -> None:
    if not _root:
        setup()
    if not data:
        return
    check_file(data[1:] if data[0] % 2 == 0 else built(provider(data[1:])))


def cleanup() -> None:  # (for a caller that wants the directory gone)
    shutil.rmtree(_root, ignore_errors=True)
