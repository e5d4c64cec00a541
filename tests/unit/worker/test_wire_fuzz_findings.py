"""What fuzz/targets/wire_codec.py found in the worker's side of the wire codec, one test each."""

from __future__ import annotations

import json

import pytest
from inferd.worker.compat import triton_python_backend_utils as pb_utils
from inferd.worker.wire import codec
from inferd.worker.wire import messages as m


def test_execute_columns_with_a_poll_us_that_is_not_an_int_reads_as_the_generic_decoder_reads_it():
    """The fast decoder turned the columns into objects, then gave up on poll_us: the generic decoder then
    refused the (changed) header, "TensorColumn must be a JSON object", where it reads the message."""
    raw = (b'{"batch_id":1,"request_ids":[1],"inputs":[{"name":"X","datatype":"FP32","shape":[1],"frame":0}],'
           b'"poll_us":1.5,"t":"execute_columns"}')
    header = json.loads(raw)
    del header["t"]
    assert m.decode_header(raw) == codec._build(m.ExecuteColumns, header)
    assert m.decode_header(raw).poll_us == 1.5


def test_a_response_parameter_beyond_int64_is_refused_by_pb_utils():
    """The worker wrote it as a JSON integer, which the supervisor's orjson reads as a float (Triton keeps
    int parameters as int64 and refuses the response)."""
    with pytest.raises(pb_utils.TritonModelException, match="int64"):
        pb_utils.InferenceResponse([], parameters={"n": 1 << 64})
    with pytest.raises(pb_utils.TritonModelException, match="int64"):
        pb_utils.InferenceResponse([], parameters={"n": -(1 << 63) - 1})
    assert pb_utils.InferenceResponse([], parameters={"n": (1 << 63) - 1, "b": True}).parameters()
