"""Regressions found by fuzz/targets/json_request.py (the corpus file named in each test replays it there)."""

from __future__ import annotations

import struct

import pytest
from inferd.supervisor.http_api.codec import InferCodec
from inferd.worker.wire.errors import InferdError

from .fake_dataplane import FakeDataPlane

BIG = 18446744073709551651  # beyond uint64: orjson (and rapidjson) read it as a double


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_an_integer_beyond_64_bits_reads_as_a_float_next_to_a_nan_as_without_one(literal: str) -> None:
    """fuzz/corpus/json_request/797047832da69ff3: a document holding NaN was read by json_nonfinite, which
    refused an integer beyond 64 bits that orjson reads as a float when no NaN is there (400 or not depended
    on an unrelated value). Both readings give the float now."""
    codec = InferCodec(FakeDataPlane())
    without = b'{"inputs":[{"name":"A","datatype":"FP64","shape":[2],"data":[1.5,%d]}]}' % BIG
    with_nan = b'{"inputs":[{"name":"A","datatype":"FP64","shape":[3],"data":[1.5,%d,%s]}]}' % (BIG, literal.encode())
    a = codec.parse("m", "", {}, without).request.inputs[0].data
    b = codec.parse("m", "", {}, with_nan).request.inputs[0].data
    assert bytes(a) == struct.pack("<2d", 1.5, float(BIG))  # orjson's reading
    assert bytes(b)[:16] == bytes(a)


def test_a_number_beyond_a_double_is_still_refused_next_to_a_nan() -> None:
    codec = InferCodec(FakeDataPlane())
    with pytest.raises(InferdError, match="infinity when parsed as double"):
        codec.parse("m", "", {}, b'{"inputs":[{"name":"A","datatype":"FP64","shape":[2],"data":[NaN,%s]}]}'
                    % (b"9" * 400,))


@pytest.mark.parametrize("nan", [b"", b",NaN"])
def test_a_lone_surrogate_in_an_overridden_duplicate_key_is_refused_as_triton_refuses_it(nan: bytes) -> None:
    """fuzz/corpus/json_request/4d6067ee77fb31f9 (the target's reference was too lax: json keeps the last of
    two `data` keys and never saw the first one's lone surrogate). Triton 2.51 answers such a body 400
    "failed to parse the request JSON buffer: The surrogate pair in string is invalid."; inferd refuses it
    too, with or without a NaN literal elsewhere (orjson and json_nonfinite read the body)."""
    codec = InferCodec(FakeDataPlane())
    body = b'{"inputs":[{"name":"A","datatype":"FP64","shape":[2],"data":["\\ud800"],"data":[1.5,2%s]}]}' % nan
    with pytest.raises(InferdError, match="failed to parse the request JSON buffer"):
        codec.parse("m", "", {}, body)
