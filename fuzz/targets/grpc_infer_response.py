"""A derived inference response -> inferd's ModelInferResponse encoder (grpc_api/wire.py) -> protobuf's parse.

The fuzz bytes choose a core InferResponse: model, version, id, parameters of every Python type a model can
return (bool, int of any size, float with NaN and -0.0, str, bytes), and outputs with their datatypes,
shapes (Python and numpy integers, out-of-range ones too), parameters and raw contents in every form the
core hands over (bytes, bytearray, memoryviews of other formats and dimensions, non-contiguous numpy
views), some of them bound for shared-memory regions. The encoder's bytes, parsed by protobuf
(ModelInferResponse, or ModelStreamInferResponse with the stream's extra parameters), must give back
exactly those values; outputs in shared memory are written there (byte-exact) and sent empty.

Documented refusals: ValueError where protobuf refuses a value too (an integer out of int64 / uint64 range,
a str that is not encodable as UTF-8), InferdError for a shared-memory region too small for its output.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from _fdp import provider
from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor.grpc_api import wire
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.worker.wire.errors import InferdError

MAX_LEN = 2048
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_DOUBLE = struct.Struct("<d")
DATATYPES = ["FP32", "BYTES", "INT64", "BOOL", "UINT8", "FP16", "BF16", "", "fp32", "x" * 40, "ü"]
INTS = [0, 1, -1, 127, 128, INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, UINT64_MAX, UINT64_MAX + 1, 2**100]


class _Shm:
    def __init__(self) -> None:
        self.writes: list[tuple[str, int, bytes]] = []

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        self.writes.append((region, offset, memoryview(data).tobytes()))


def _text(fdp: Any, limit: int = 12) -> str:
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, limit))
    if fdp.ConsumeIntInRange(0, 15) == 0:  # now and then a lone surrogate: not encodable, a ValueError
        return raw.decode("utf-8", "replace") + "\ud800"
    return raw.decode("utf-8", "replace")


def _int(fdp: Any) -> int:
    if fdp.ConsumeBool():
        return int(fdp.PickValueInList(INTS))
    return fdp.ConsumeIntInRange(0, UINT64_MAX) - (2**63 if fdp.ConsumeBool() else 0)


def _value(fdp: Any) -> Any:
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        return fdp.ConsumeBool()
    if kind == 1:
        return _int(fdp)
    if kind == 2:
        raw = fdp.ConsumeBytes(8)
        return _DOUBLE.unpack(raw.ljust(8, b"\0"))[0]  # NaNs with payloads, infinities, -0.0
    if kind == 3:
        return _text(fdp)
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8))  # sent as string_param, decoded with replacement


def _params(fdp: Any) -> dict[str, Any]:
    return {_text(fdp, 6): _value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def _data(fdp: Any) -> Any:
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    form = fdp.ConsumeIntInRange(0, 6)
    if form == 0:
        return raw
    if form == 1:
        return bytearray(raw)
    if form == 2:
        return memoryview(raw)
    arr = np.frombuffer(raw[: len(raw) // 4 * 4], dtype=np.float32)
    if form == 3:
        return memoryview(arr)  # format "f"
    if form == 4:
        return memoryview(arr[::2])  # not contiguous
    if form == 5:
        return memoryview(arr.reshape(1, -1, 1) if arr.size else arr.reshape(0, 2))  # 3-D / empty 2-D
    return memoryview(np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2"))


def _outputs(fdp: Any) -> tuple[list[Tensor], dict[str, tuple[str, int, int]]]:
    outputs: list[Tensor] = []
    shm: dict[str, tuple[str, int, int]] = {}
    for i in range(fdp.ConsumeIntInRange(0, 4)):
        name = _text(fdp, 6) + str(i)  # distinct: shared memory is looked up by output name
        datatype = fdp.PickValueInList(DATATYPES)
        shape: list[Any] = []
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            d = _int(fdp) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 300)
            shape.append(np.int64(d) if fdp.ConsumeIntInRange(0, 7) == 0 and INT64_MIN <= d <= INT64_MAX else d)
        data = _data(fdp)
        outputs.append(Tensor(name, datatype, shape, data, _params(fdp) if fdp.ConsumeBool() else {}))
        if fdp.ConsumeIntInRange(0, 3) == 0:
            nbytes = memoryview(data).nbytes
            shm[name] = (_text(fdp, 4) or "r", fdp.ConsumeIntInRange(0, 1 << 20), nbytes + fdp.ConsumeIntInRange(-2, 2))
    return outputs, shm


# ---- what protobuf must read back ----


def _encodable(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _param_expected(v: Any) -> tuple[str, Any] | None:
    """The InferParameter member and value protobuf must read, or None where the encoder must refuse."""
    if isinstance(v, bool):
        return "bool_param", v
    if isinstance(v, int):
        if v > INT64_MAX:
            return ("uint64_param", v) if v <= UINT64_MAX else None
        return ("int64_param", v) if v >= INT64_MIN else None
    if isinstance(v, float):
        return "double_param", _DOUBLE.pack(v)
    if isinstance(v, bytes):
        return "string_param", v.decode("utf-8", "replace")
    return ("string_param", v) if _encodable(v) else None


def _params_read(params: Any) -> dict[str, tuple[str | None, Any]]:
    out: dict[str, tuple[str | None, Any]] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        value = getattr(p, which) if which else None
        out[key] = (which, _DOUBLE.pack(value) if which == "double_param" else value)
    return out


def _check_params(got: Any, want: dict[str, Any], where: str) -> None:
    expected = {k: _param_expected(v) for k, v in want.items()}
    assert _params_read(got) == expected, f"{where} parameters read {_params_read(got)!r}, sent {expected!r}"


def _refusals(resp: InferResponse, shm: dict[str, tuple[str, int, int]], extra: dict[str, Any]) -> set[type]:
    """The errors the encoder may raise for this response (none: it must encode it)."""
    errors: set[type] = set()
    params = {**resp.parameters, **extra}
    texts = [resp.model_name, resp.model_version, resp.id, *params]
    values = list(params.values())
    for t in resp.outputs:
        texts += [t.name, t.datatype, *t.parameters]
        values += list(t.parameters.values())
        if any(not INT64_MIN <= int(d) <= INT64_MAX for d in t.shape):
            errors.add(ValueError)
        if t.name in shm and memoryview(t.data).nbytes > shm[t.name][2]:
            errors.add(InferdError)
    if not all(map(_encodable, texts)) or any(_param_expected(v) is None for v in values):
        errors.add(ValueError)
    return errors


def _check(got: Any, resp: InferResponse, shm: dict[str, tuple[str, int, int]], extra: dict[str, Any]) -> None:
    assert (got.model_name, got.model_version, got.id) == (resp.model_name, resp.model_version, resp.id)
    _check_params(got.parameters, {**resp.parameters, **extra}, "response")
    assert len(got.outputs) == len(resp.outputs) == len(got.raw_output_contents), "one entry per output"
    for o, t, raw in zip(got.outputs, resp.outputs, got.raw_output_contents):
        assert (o.name, o.datatype, list(o.shape)) == (t.name, t.datatype, [int(d) for d in t.shape]), o
        _check_params(o.parameters, t.parameters, f"output {t.name!r}")
        want = b"" if t.name in shm else memoryview(t.data).tobytes()
        assert raw == want, f"output {t.name!r} contents {raw[:40]!r}..., sent {want[:40]!r}..."


def test_one_input(data: bytes) -> None:
    fdp = provider(data)
    resp = InferResponse(_text(fdp), _text(fdp, 3), _text(fdp, 6), parameters=_params(fdp))
    stream = fdp.ConsumeBool()
    extra = {"triton_final_response": fdp.ConsumeBool(), **_params(fdp)} if stream else {}
    resp.outputs, shm = _outputs(fdp)
    refusals = _refusals(resp, shm, extra)
    sink = _Shm()
    try:
        if stream:
            encoded = wire.encode_stream_response(resp, shm, sink, extra)  # type: ignore[arg-type]
        else:
            encoded = wire.encode_response(resp, shm, sink)  # type: ignore[arg-type]
    except (ValueError, InferdError) as exc:
        assert type(exc) in refusals or (isinstance(exc, ValueError) and ValueError in refusals), (
            f"the encoder refused a valid response: {exc!r}"
        )
        return
    assert not refusals, f"the encoder took a response it must refuse ({refusals})"
    if stream:
        msg = pb.ModelStreamInferResponse.FromString(encoded)
        assert msg.error_message == "" and msg.HasField("infer_response")
        _check(msg.infer_response, resp, shm, extra)
    else:
        _check(pb.ModelInferResponse.FromString(encoded), resp, shm, {})
    written = [(shm[t.name][0], shm[t.name][1], memoryview(t.data).tobytes()) for t in resp.outputs if t.name in shm]
    assert sink.writes == written, f"shared memory writes {sink.writes!r}, expected {written!r}"
    message = _text(fdp, 40)
    if _encodable(message):
        err = pb.ModelStreamInferResponse.FromString(wire.encode_stream_error(message))
        assert err.error_message == message and not err.HasField("infer_response")
