"""The hand-written ModelInfer wire codec against protobuf: whatever protobuf reads from a request,
the fast parser reads the same (or leaves the message to protobuf); whatever we write, protobuf
parses into the response the protobuf-built path produced.

In process (no tritonclient here): our generated messages are the reference.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor.grpc_api import convert, wire
from inferd.supervisor.inference.limits import MAX_TENSORS
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.worker.wire.errors import InferdError

_INT64_MAX = 2**63 - 1

# ---------------------------------------------------------------------------------------------
# requests

names = st.text(max_size=12)
param_values = st.one_of(
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("int64_param"), st.integers(-(2**63), _INT64_MAX)),
    st.tuples(st.just("string_param"), st.text(max_size=20)),
    st.tuples(st.just("double_param"), st.floats(allow_nan=False)),
    st.tuples(st.just("uint64_param"), st.integers(0, 2**64 - 1)),
    st.just((None, None)),
)
param_maps = st.dictionaries(names, param_values, max_size=4)
shapes = st.lists(st.integers(-(2**63), _INT64_MAX) | st.integers(0, 300), max_size=5)


def _fill_params(target: Any, params: dict[str, tuple[str | None, Any]]) -> None:
    for k, (which, value) in params.items():
        p = target[k]
        if which is None:
            p.SetInParent()
        else:
            setattr(p, which, value)


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=draw(names), model_version=draw(names), id=draw(names))
    _fill_params(msg.parameters, draw(param_maps))
    for _ in range(draw(st.integers(0, 4))):
        t = msg.inputs.add(name=draw(names), datatype=draw(st.sampled_from(["FP32", "BYTES", "INT64", ""])))
        t.shape.extend(draw(shapes))
        _fill_params(t.parameters, draw(param_maps))
    for _ in range(draw(st.integers(0, 3))):
        o = msg.outputs.add(name=draw(names))
        _fill_params(o.parameters, draw(param_maps))
    msg.raw_input_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=4)))
    return msg


def _same(a: convert.ParsedRequest, b: convert.ParsedRequest) -> None:
    assert (a.model_name, a.model_version, a.id) == (b.model_name, b.model_version, b.id)
    assert a.parameters == b.parameters
    assert [(t.name, t.datatype, t.shape, t.parameters, t.contents) for t in a.inputs] == [
        (t.name, t.datatype, t.shape, t.parameters, t.contents) for t in b.inputs
    ]
    assert [(o.name, o.parameters) for o in a.outputs] == [(o.name, o.parameters) for o in b.outputs]
    assert [bytes(r) for r in a.raw] == [bytes(r) for r in b.raw]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_fast_parse_matches_protobuf(msg: pb.ModelInferRequest) -> None:
    data = msg.SerializeToString()
    fast = wire.parse_request(data)
    assert fast is not None, "an ordinary request must take the fast path"
    _same(fast, convert.from_message(pb.ModelInferRequest.FromString(data)))
    assert all(isinstance(r, memoryview) for r in fast.raw)  # zero copy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_shared_head_parse_matches_the_whole_parse(msg: pb.ModelInferRequest) -> None:
    """A request whose head (the fields before raw_input_contents) was parsed before gives the values
    parsing it all gives, the first time and from the shared head."""
    data = msg.SerializeToString()
    whole = wire._parse(data)
    for _ in range(2):
        headed = wire._parse_headed(data)
        assert headed is not None, "a request serialized by protobuf has its raw contents last"
        _same(headed, whole)
    if whole.inputs:  # what to_core keeps of a shared head is its own
        assert wire._parse_headed(data).inputs is headed.inputs  # type: ignore[union-attr]


def test_the_tensors_of_a_shared_head_have_their_own_shapes() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1, 2])
    msg.raw_input_contents.append(bytes(8))
    data = msg.SerializeToString()
    first, second = wire.decode_request(data), wire.decode_request(data)
    assert isinstance(first, convert.ParsedRequest) and isinstance(second, convert.ParsedRequest)
    assert first.inputs is second.inputs  # one parse of the head
    a, _ = convert.to_core(first, None)  # type: ignore[arg-type]
    b, _ = convert.to_core(second, None)  # type: ignore[arg-type]
    a.inputs[0].shape[0] = 7
    assert b.inputs[0].shape == [1, 2] and first.inputs[0].shape == [1, 2]


def test_raw_contents_before_other_fields_parse_whole() -> None:
    data = _ld(7, b"\x01\x02") + _ld(1, b"m") + _ld(7, b"\x03")
    assert wire._parse_headed(data) is None
    got = wire.parse_request(data)
    assert got is not None and got.model_name == "m" and [bytes(r) for r in got.raw] == [b"\x01\x02", b"\x03"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_like_protobuf(data: bytes) -> None:
    try:
        want: convert.ParsedRequest | None = convert.from_message(pb.ModelInferRequest.FromString(data))
    except Exception:
        want = None
    got = wire.decode_request(data)
    if want is None:
        assert got is convert.BAD
    else:
        assert isinstance(got, convert.ParsedRequest)
        _same(got, want)


def _varint(v: int) -> bytes:
    v &= 2**64 - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


@pytest.mark.parametrize(
    "data",
    [
        # unpacked shape values, a negative one among them
        _ld(5, _ld(1, b"X") + _ld(2, b"FP32") + b"\x18\x02" + b"\x18" + _varint(-1) + b"\x18\x03"),
        # a repeated singular field: the last one wins
        _ld(1, b"first") + _ld(1, b"second"),
        # a repeated map key: the last one wins
        _ld(4, _ld(1, b"k") + _ld(2, b"\x10\x05")) + _ld(4, _ld(1, b"k") + _ld(2, b"\x08\x01")),
        # two members of one oneof: the last one wins
        _ld(4, _ld(1, b"k") + _ld(2, b"\x10\x05\x1a\x01s")),
        # a map entry without key or value
        _ld(4, b""),
        # multi-byte lengths
        _ld(7, bytes(70000)) + _ld(1, b"m" * 200),
        # an empty input and an empty output
        _ld(5, b"") + _ld(6, b""),
    ],
)
def test_hand_made_wire_forms(data: bytes) -> None:
    fast = wire.parse_request(data)
    assert fast is not None
    _same(fast, convert.from_message(pb.ModelInferRequest.FromString(data)))


# issue 38 #7: a map entry's `value` (an InferParameter message) given more than once is merged by protobuf:
# a member set by an earlier occurrence stays unless a later one sets one. The fast parser kept the last
# occurrence alone, so `value {int64_param: 5} value {}` read as a parameter without a value.
_K5 = _ld(1, b"k") + _ld(2, b"\x10\x05")


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (_ld(4, _K5 + _ld(2, b"")), "request"),  # then an empty value: 5 stays
        (_ld(4, _ld(1, b"k") + _ld(2, b"\x1a\x01s") + _ld(2, b"")), "request"),  # a string stays too
        (_ld(4, _ld(2, b"\x10\x05") + _ld(1, b"k") + _ld(2, b"")), "request"),  # the key between them
        (_ld(4, _K5 + _ld(2, b"\x08\x01") + _ld(2, b"")), "request"),  # the last member set wins, then kept
        (_ld(5, _ld(1, b"X") + _ld(4, _K5 + _ld(2, b""))), "input"),
        (_ld(6, _ld(1, b"Y") + _ld(2, _K5 + _ld(2, b""))), "output"),
    ],
)
def test_repeated_parameter_values_merge_like_protobuf(data: bytes, where: str) -> None:
    want = convert.from_message(pb.ModelInferRequest.FromString(data))
    fast = wire.parse_request(data)
    assert fast is not None, "a valid request must take the fast path"
    _same(fast, want)
    params = {"request": fast.parameters, "input": fast.inputs[0].parameters if fast.inputs else {},
              "output": fast.outputs[0].parameters if fast.outputs else {}}[where]
    assert params["k"][0] is not None, "the merged value keeps the member set before"


def test_a_sequence_id_given_in_two_value_occurrences_is_served() -> None:
    """The request of issue 38 #7 end to end: the server refused it ("expected int64_param or string_param")."""
    entry = _ld(1, b"sequence_id") + _ld(2, b"\x10\x07") + _ld(2, b"")
    data = _ld(1, b"m") + _ld(4, entry)
    parsed = wire.decode_request(data)
    assert isinstance(parsed, convert.ParsedRequest)
    req, _ = convert.to_core(parsed, None)  # type: ignore[arg-type]
    assert req.correlation_id == 7


def _entry_bytes(which: str | None, value: Any) -> bytes:
    """The InferParameter member's wire form (empty for no member)."""
    msg = pb.InferParameter()
    if which is not None:
        setattr(msg, which, value)
    return msg.SerializeToString()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(names, param_values, st.lists(param_values, max_size=3), st.integers(0, 3)), max_size=5))
def test_parameter_values_in_several_occurrences_read_like_protobuf(entries: list[Any]) -> None:
    """Map entries whose value comes in several occurrences (earlier members, empty ones) and whose key may
    come last: the fast parser reads what protobuf reads."""
    data = b""
    for key, (which, value), earlier, empties in entries:
        body = b"".join(_ld(2, _entry_bytes(w, v)) for w, v in earlier)
        body += _ld(2, _entry_bytes(which, value)) + _ld(2, b"") * empties
        data += _ld(4, (body + _ld(1, key.encode())) if empties % 2 else (_ld(1, key.encode()) + body))
    fast = wire.parse_request(data)
    assert fast is not None
    _same(fast, convert.from_message(pb.ModelInferRequest.FromString(data)))


@pytest.mark.parametrize(
    "data",
    [
        _ld(5, _ld(1, b"X") + _ld(5, b"\x32\x04" + struct.pack("<f", 1.0))),  # typed contents
        _ld(15, b"unknown") + _ld(1, b"m"),  # an unknown field
        b"\x08\x01" + _ld(1, b"m"),  # an unknown varint field
        _ld(1, b"\xff\xfe"),  # not UTF-8
        _ld(1, b"abc")[:-1],  # truncated
        _ld(5, _ld(1, b"X") + b"\x1a\x02\x80"),  # a packed varint running past its field
        _ld(5, b"\x18\x80"),  # an unpacked varint running past its message
        # the protobuf rules the fast parser leaves to protobuf (issue 38 #7 audit)
        b"\x7b\x7c" + _ld(1, b"m"),  # a group (field 15), skipped by protobuf
        _ld(5, _ld(1, b"X") + b"\x7b\x7c"),  # a group inside an input
        b"\x0c",  # an end-group tag alone: refused by protobuf
        _ld(4, _ld(1, b"a") + b"\x18\x01" + _ld(2, b"\x10\x05")),  # an unknown field in a map entry: protobuf drops it
        _ld(4, b"\x08\x01" + _ld(2, b"\x10\x05")),  # a map key of the wrong wire type: likewise
        _ld(4, _ld(1, b"a") + _ld(2, b"\x10\x05\x30\x01")),  # an unknown field inside the value: kept
        _ld(5, b"\x18" + b"\xff" * 9 + b"\x7f"),  # a 10-byte varint above 64 bits: protobuf truncates it
        _ld(5, _ld(5, b"\x08\x01") + _ld(5, b"\x10\x02")),  # typed contents twice: merged
        _ld(1, b"\xed\xa0\x80"),  # a UTF-16 surrogate in UTF-8: refused by both
    ],
)
def test_unusual_messages_go_to_protobuf(data: bytes) -> None:
    assert wire.parse_request(data) is None
    try:
        want: convert.ParsedRequest | None = convert.from_message(pb.ModelInferRequest.FromString(data))
    except Exception:
        want = None
    got = wire.decode_request(data)
    if want is None:
        assert got is convert.BAD
    else:
        assert isinstance(got, convert.ParsedRequest)
        _same(got, want)


def test_typed_contents_still_work_through_protobuf() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="INT8", shape=[3])
    t.contents.int_contents.extend([1, -2, 3])
    parsed = wire.decode_request(msg.SerializeToString())
    assert isinstance(parsed, convert.ParsedRequest)
    req, shm = convert.to_core(parsed, None)  # type: ignore[arg-type]
    assert shm is None
    assert bytes(req.inputs[0].data) == np.array([1, -2, 3], dtype=np.int8).tobytes()


def test_too_many_inputs_are_refused_like_before() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    for i in range(MAX_TENSORS + 1):
        msg.inputs.add(name=f"I{i}", datatype="FP32")
    parsed = wire.decode_request(msg.SerializeToString())
    assert isinstance(parsed, convert.ParsedRequest)
    with pytest.raises(InferdError, match="too many inputs"):
        convert.to_core(parsed, None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# responses: the protobuf-built response the frontend produced before the wire codec


def _set_parameters(target: Any, values: dict[str, Any]) -> None:
    for k, v in values.items():
        p = target[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            if v > _INT64_MAX:
                p.uint64_param = v
            else:
                p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        elif isinstance(v, (bytes, bytearray)):
            p.string_param = bytes(v).decode("utf-8", "replace")
        else:
            p.string_param = str(v)


def _reference(resp: InferResponse, shm_out: convert.ShmOutputs | None, out: Any = None) -> Any:
    msg = out if out is not None else pb.ModelInferResponse()
    msg.model_name, msg.model_version, msg.id = resp.model_name, resp.model_version, resp.id
    if resp.parameters:
        _set_parameters(msg.parameters, resp.parameters)
    raws = []
    for t in resp.outputs:
        o = msg.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if t.parameters:
            _set_parameters(o.parameters, t.parameters)
        raws.append(b"" if shm_out and t.name in shm_out else bytes(t.data))
    msg.raw_output_contents.extend(raws)
    return msg


class FakeShm:
    def __init__(self) -> None:
        self.writes: list[tuple[str, int, bytes]] = []

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        self.writes.append((region, offset, bytes(data)))


py_params = st.dictionaries(
    names,
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=10),
        st.binary(max_size=10),
    ),
    max_size=3,
)


@st.composite
def responses(draw: st.DrawFn) -> InferResponse:
    outputs = []
    for i in range(draw(st.integers(0, 3))):
        arr = np.asarray(draw(st.lists(st.floats(width=32, allow_nan=False), max_size=8)), dtype=np.float32)
        form = draw(st.sampled_from(["bytes", "memoryview", "float_view", "bytearray"]))
        data: Any = {
            "bytes": arr.tobytes(),
            "memoryview": memoryview(arr.tobytes()),
            "float_view": memoryview(arr),
            "bytearray": bytearray(arr.tobytes()),
        }[form]
        shape = draw(st.lists(st.integers(-(2**63), _INT64_MAX) | st.integers(0, 9), max_size=3))
        outputs.append(Tensor(draw(names) + str(i), draw(st.sampled_from(["FP32", ""])), shape, data, draw(py_params)))
    return InferResponse(draw(names), draw(names), draw(names), outputs, draw(py_params))


def _eq(a: Any, b: Any) -> bool:
    # NaN-free by construction; -0.0 == 0.0 compares as equal in both
    return bool(a == b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_encoded_response_parses_like_the_protobuf_one(resp: InferResponse) -> None:
    got = pb.ModelInferResponse.FromString(wire.encode_response(resp, None, FakeShm()))  # type: ignore[arg-type]
    assert _eq(got, _reference(resp, None))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.booleans())
def test_encoded_stream_response_parses_like_the_protobuf_one(resp: InferResponse, final: bool) -> None:
    data = wire.encode_stream_response(resp, None, FakeShm(), {"triton_final_response": final})  # type: ignore[arg-type]
    want = pb.ModelStreamInferResponse()
    _reference(resp, None, want.infer_response)
    want.infer_response.parameters["triton_final_response"].bool_param = final
    assert _eq(pb.ModelStreamInferResponse.FromString(data), want)


def test_stream_error_message() -> None:
    msg = pb.ModelStreamInferResponse.FromString(wire.encode_stream_error("bad thing: ünïcode"))
    assert msg.error_message == "bad thing: ünïcode" and not msg.HasField("infer_response")
    assert pb.ModelStreamInferResponse.FromString(wire.encode_stream_error("")) == pb.ModelStreamInferResponse()


def test_shm_outputs_are_written_and_left_empty() -> None:
    a = np.arange(4, dtype=np.float32)
    resp = InferResponse("m", "1", "", [Tensor("A", "FP32", [4], a.tobytes()), Tensor("B", "FP32", [4], memoryview(a))])
    shm = FakeShm()
    got = pb.ModelInferResponse.FromString(wire.encode_response(resp, {"B": ("r", 8, 16)}, shm))  # type: ignore[arg-type]
    assert list(got.raw_output_contents) == [a.tobytes(), b""]
    assert shm.writes == [("r", 8, a.tobytes())]
    with pytest.raises(InferdError, match="should be at least 16 bytes"):
        wire.encode_response(resp, {"A": ("r", 0, 15)}, FakeShm())  # type: ignore[arg-type]


def test_big_output_is_copied_once_and_byte_exact() -> None:
    x = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    resp = InferResponse("identity", "1", "req-7", [Tensor("OUTPUT0", "FP32", [1 << 20], memoryview(x))])
    data = wire.encode_response(resp, None, FakeShm())  # type: ignore[arg-type]
    assert data == _reference(resp, None).SerializeToString()


def test_an_empty_multidimensional_output_view_encodes_empty() -> None:
    """Fuzz finding (grpc_infer_response crash-15aab8df): a zero-size output given as a memoryview of more than
    one dimension (a (0, 2) float32 array) failed with TypeError from memoryview.cast."""
    outputs = [Tensor("A", "FP32", [0, 2], memoryview(np.zeros((0, 2), dtype=np.float32))),
               Tensor("B", "FP32", [0], memoryview(np.zeros(0, dtype=np.float32)))]
    resp = InferResponse("m", "1", "", outputs)
    got = pb.ModelInferResponse.FromString(wire.encode_response(resp, None, FakeShm()))  # type: ignore[arg-type]
    assert list(got.raw_output_contents) == [b"", b""] and list(got.outputs[0].shape) == [0, 2]


def test_out_of_range_parameter_fails_like_protobuf() -> None:
    resp = InferResponse("m", "1", parameters={"p": 2**64})
    with pytest.raises(ValueError):
        wire.encode_response(resp, None, FakeShm())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _reference(resp, None)


@pytest.mark.parametrize(
    ("shape", "data", "message"),
    [
        ([2, -1], b"", "input 'X' has a negative dimension in shape [2, -1]"),
        ([2, 3], bytes(20), "input byte size mismatch for input 'X' for model 'm'. Expected 24, got 20"),
    ],
)
def test_to_core_names_a_bad_shape_or_size(shape: list[int], data: bytes, message: str) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=shape)
    msg.raw_input_contents.append(data)
    parsed = wire.decode_request(msg.SerializeToString())
    assert isinstance(parsed, convert.ParsedRequest)
    with pytest.raises(InferdError) as err:
        convert.to_core(parsed, None)  # type: ignore[arg-type]
    assert err.value.message == message
