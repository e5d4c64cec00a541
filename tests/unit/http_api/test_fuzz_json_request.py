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
