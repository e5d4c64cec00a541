"""pb_utils arguments taken as python_backend's pybind11 bindings take them (worker/pb_args.py)."""

import numpy as np
import pytest
from inferd.worker import pb_args
from inferd.worker.compat import load_pb_utils

pb_utils = load_pb_utils()


@pytest.mark.parametrize("value", ["add_sub", b"add_sub", bytearray(b"add_sub"), np.str_("add_sub"),
                                   np.bytes_(b"add_sub"), np.array([b"add_sub"], dtype=object)[0]])
def test_text_takes_str_and_bytes(value):
    got = pb_args.text(value, "model_name")
    assert got == "add_sub" and type(got) is str


@pytest.mark.parametrize("value", [1, None, 1.5, ["a"], np.array(["a"])])
def test_text_refuses_other_types(value):
    with pytest.raises(TypeError, match="model_name"):
        pb_args.text(value, "model_name")


def test_text_refuses_bytes_that_are_not_utf8():
    with pytest.raises(TypeError, match="not UTF-8"):
        pb_args.text(b"\xff\xfe", "model_name")


@pytest.mark.parametrize("value", [["A", b"B"], ("A", b"B"), np.array([b"A", b"B"], dtype=object),
                                   np.array(["A", "B"])])
def test_texts_takes_sequences(value):
    assert pb_args.texts(value, "requested_output_names") == ["A", "B"]


@pytest.mark.parametrize("value", ["AB", b"AB", {"A": 1}, {"A"}, 3, np.array([["A"]])])
def test_texts_refuses_non_sequences(value):
    with pytest.raises(TypeError, match="requested_output_names"):
        pb_args.texts(value, "requested_output_names")


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint32(3), np.int8(3)])
def test_integer_takes_ints_and_numpy_ints(value):
    got = pb_args.integer(value, "timeout", pb_args.UINT64)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value, bounds", [(1.0, pb_args.INT64), (np.float32(1), pb_args.INT64),
                                           ("1", pb_args.INT64), (-1, pb_args.UINT32),
                                           (1 << 32, pb_args.UINT32), (1 << 63, pb_args.INT64)])
def test_integer_refuses_floats_text_and_out_of_range(value, bounds):
    with pytest.raises(TypeError, match="flags"):
        pb_args.integer(value, "flags", bounds)


def test_correlation_id():
    assert pb_args.correlation_id(np.uint64(7)) == 7 and pb_args.correlation_id(np.str_("s")) == "s"
    for bad in (b"s", 1.0, -1, None):
        assert pb_args.correlation_id(bad) is None


def test_inference_request_normalises_its_arguments():
    x = np.zeros(2, np.float32)
    request = pb_utils.InferenceRequest(
        model_name=b"add_sub", inputs=(pb_utils.Tensor(b"INPUT0", x),), requested_output_names=np.array([b"OUT"]),
        request_id=b"r1", model_version=np.int64(2), flags=np.uint32(1), timeout=np.int64(5),
        correlation_id=np.int32(9))
    assert request.model_name() == "add_sub" and request.requested_output_names() == ["OUT"]
    assert request.request_id() == "r1" and request.correlation_id() == 9
    assert (request.flags(), request.timeout()) == (1, 5)
    assert [t.name() for t in request.inputs()] == ["INPUT0"]
    with pytest.raises(TypeError, match="inputs"):
        pb_utils.InferenceRequest(model_name="m", inputs=[x], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID must be integer or string"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=b"c")


def test_memory_type_enum_exists_for_preferred_memory():
    memory = pb_utils.PreferredMemory(pb_utils.MemoryType.TRITONSERVER_MEMORY_GPU, 0)
    assert memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_GPU
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], preferred_memory=memory)
    assert request.parameters() == "{}"
