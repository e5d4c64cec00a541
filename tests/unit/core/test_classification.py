"""core.classification: Triton's classification strings, shapes and label files (triton.md §1.6)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inferd.supervisor.core import classification as cls
from inferd.supervisor.inference.tensors import bytes_elements, element_count
from inferd.supervisor.inference.types import InferResponse, RequestedOutput, Tensor
from inferd.worker.wire.dtypes import BY_NAME
from inferd.worker.wire.errors import ErrorCode, InferdError

LABELS = (b"cat", b"dog", b"", b"bird fly", b"fish")


def tensor(values, datatype: str = "FP32", shape=None, name: str = "OUT") -> Tensor:
    arr = np.asarray(values, dtype=BY_NAME[datatype].numpy)
    return Tensor(name, datatype, list(arr.shape) if shape is None else shape, arr.tobytes())


def entries(t: Tensor) -> list[str]:
    assert t.datatype == "BYTES"
    return [b.decode() for b in bytes_elements(t.data, element_count(t.shape), t.name)]


# ---------------------------------------------------------------- strings and shapes

def test_top_k_with_labels_and_ties_in_index_order():
    out = cls.classify(tensor([0.1, 0.9, 0.5, 0.9, 0.3]), 5, LABELS)
    assert (out.name, out.shape) == ("OUT", [5])
    assert entries(out) == ["0.900000:1:dog", "0.900000:3:bird fly", "0.500000:2", "0.300000:4:fish",
                            "0.100000:0:cat"]


def test_k_is_capped_by_the_class_count_and_labels_may_run_out():
    out = cls.classify(tensor([0, 0, 0, 0, 1, 3, 2]), 100, LABELS)
    assert out.shape == [7]
    assert entries(out)[:3] == ["3.000000:5", "2.000000:6", "1.000000:4:fish"]


@pytest.mark.parametrize(("value", "text"), [
    (1e20, "100000002004087734272.000000"), (-1e-7, "-0.000000"), (3.14159265, "3.141593"),
    (123456789.0, "123456792.000000"), (1.5e-3, "0.001500"), (math.inf, "inf"), (-math.inf, "-inf"),
])
def test_fp32_values_print_as_c_does(value, text):
    assert entries(cls.classify(tensor([value]), 1)) == [f"{text}:0"]


def test_fp64_prints_its_own_precision():
    assert entries(cls.classify(tensor([0.1234567891], "FP64"), 1)) == ["0.123457:0"]


@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"])
def test_integer_values_print_as_integers(datatype):
    values = [1, 100, 3, 2] if datatype.startswith("U") else [1, -7, 100, 3]
    out = cls.classify(tensor(values, datatype), 2, LABELS)
    top = sorted(values, reverse=True)[:2]
    assert entries(out) == [f"{v}:{values.index(v)}" + (f":{LABELS[values.index(v)].decode()}"
                                                         if LABELS[values.index(v)] else "") for v in top]


def test_extreme_integers():
    out = cls.classify(tensor([2**64 - 1, 0], "UINT64"), 1)
    assert entries(out) == [f"{2**64 - 1}:0"]
    out = cls.classify(tensor([-(2**63), 2**63 - 1], "INT64"), 2)
    assert entries(out) == [f"{2**63 - 1}:1", f"{-(2**63)}:0"]


def test_batched_rows_are_classified_one_by_one():
    out = cls.classify(tensor([[0.1, 0.9, 0.5], [5, 4, 3]]), 2, LABELS, batched=True)
    assert out.shape == [2, 2]
    assert entries(out) == ["0.900000:1:dog", "0.500000:2", "5.000000:0:cat", "4.000000:1:dog"]


def test_batched_items_of_several_dimensions_are_flattened():
    out = cls.classify(tensor(np.arange(12).reshape(2, 3, 2)), 2, batched=True)
    assert out.shape == [2, 2]
    assert entries(out) == ["5.000000:5", "4.000000:4", "11.000000:5", "10.000000:4"]


def test_without_batching_the_whole_tensor_is_one_row():
    out = cls.classify(tensor([[0.1, 0.9, 0.5, 0.9, 0.3], [5, 4, 3, 2, 1]]), 2, LABELS)
    assert out.shape == [2]
    assert entries(out) == ["5.000000:5", "4.000000:6"]


@pytest.mark.parametrize(("shape", "batched", "expected"), [
    ([0], False, [0]), ([0, 5], True, [0, 5]), ([3, 0], True, [3, 0]), ([2, 0], False, [0]),
])
def test_empty_tensors(shape, batched, expected):
    out = cls.classify(tensor(np.zeros(shape)), 5, batched=batched)
    assert (out.shape, bytes(out.data)) == (expected, b"")


def test_nan_ranks_below_every_number():
    assert entries(cls.classify(tensor([math.nan, -math.inf, 1.0, math.nan]), 4)) == [
        "1.000000:2", "nan:0", "-inf:1", "nan:3"]


@pytest.mark.parametrize("datatype", ["BOOL", "FP16", "BF16", "BYTES"])
def test_unsupported_datatypes_are_refused_with_tritons_words(datatype):
    t = Tensor("OUT", datatype, [1], b"\x01\x00\x00\x00a" if datatype == "BYTES" else b"\x01\x00"[:BY_NAME[
        datatype].itemsize])
    with pytest.raises(InferdError) as info:
        cls.classify(t, 1)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == f"class result not available for output due to unsupported type '{datatype}'"


def test_data_that_does_not_fit_the_shape_is_an_internal_error():
    with pytest.raises(InferdError) as info:
        cls.classify(tensor([1.0, 2.0], shape=[3]), 1)
    assert info.value.code == ErrorCode.INTERNAL


def test_memoryview_data():
    t = tensor([0.25, 0.75])
    t.data = memoryview(bytearray(t.data)).cast("f")
    assert entries(cls.classify(t, 1)) == ["0.750000:1"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40), st.integers(1, 50))
def test_order_is_descending_with_ties_by_index(values, k):
    out = entries(cls.classify(tensor(values, "INT32"), k))
    expected = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    assert out == [f"{values[i]}:{i}" for i in expected]


# ---------------------------------------------------------------- requests and responses

def test_requested_reads_the_output_parameters():
    outputs = [RequestedOutput("A"), RequestedOutput("B", {"classification": 3, "binary_data": True}),
               RequestedOutput("C", {"classification": 0}), RequestedOutput("D", {"classification": 2**32 + 2}),
               RequestedOutput("E", {"classification": 2**32})]
    assert cls.requested(outputs) == {"B": 3, "D": 2}
    assert cls.requested([RequestedOutput("A"), RequestedOutput("C", {"classification": 0})]) is None
    assert cls.requested([]) is None


@pytest.mark.parametrize("value", [-1, "2", 2.0, True, None])
def test_requested_refuses_what_is_not_a_count(value):
    with pytest.raises(InferdError) as info:
        cls.requested([RequestedOutput("OUT", {"classification": value})])
    assert info.value.code == ErrorCode.INVALID_ARG and "'classification' of output 'OUT'" in info.value.message


def test_apply_replaces_only_the_wanted_outputs():
    raw = tensor([1, 2], "INT32", name="RAW")
    resp = InferResponse("m", "1", outputs=[tensor([0.5, 0.25]), raw])
    assert cls.apply(resp, {"OUT": 1}, {"OUT": LABELS}, batched=False) is resp
    assert entries(resp.outputs[0]) == ["0.500000:0:cat"]
    assert resp.outputs[1] is raw


# ---------------------------------------------------------------- label files

def test_label_files_are_read_per_output(tmp_path):
    (tmp_path / "labels.txt").write_bytes(b"cat\ndog\n\nbird fly\r\n\xff\n")
    config = {"output": [{"name": "A", "label_filename": "labels.txt"}, {"name": "B", "label_filename": ""},
                         {"name": "C"}, {"name": "D", "label_filename": "/labels.txt"}]}
    labels = cls.load_labels(str(tmp_path), config)
    assert labels == {"A": (b"cat", b"dog", b"", b"bird fly\r", b"\xff"), "D": labels["A"]}
    assert cls.load_labels(str(tmp_path), {}) == {}


def test_last_line_without_newline_counts(tmp_path):
    (tmp_path / "l").write_bytes(b"a\nb")
    assert cls.read_labels(str(tmp_path), "l") == (b"a", b"b")
    (tmp_path / "e").write_bytes(b"")
    assert cls.read_labels(str(tmp_path), "e") == ()


def test_missing_label_file_fails_with_tritons_words(tmp_path):
    with pytest.raises(InferdError) as info:
        cls.read_labels(str(tmp_path), "labels.txt", "OUT")
    assert info.value.code == ErrorCode.INTERNAL
    assert info.value.message == f"failed to open text file for read {tmp_path}/labels.txt: No such file or directory"


@pytest.mark.parametrize("name", ["../secret", "a/../../secret", ".", "/"])
def test_label_file_must_lie_in_the_model_directory(tmp_path, name):
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "secret").write_text("password\n")
    with pytest.raises(InferdError) as info:
        cls.read_labels(str(model), name, "OUT")
    assert info.value.code == ErrorCode.INVALID_ARG and "model directory" in info.value.message


def test_oversized_label_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cls, "MAX_LABEL_FILE_BYTES", 8)
    (tmp_path / "l").write_bytes(b"0123456789")
    with pytest.raises(InferdError) as info:
        cls.read_labels(str(tmp_path), "l")
    assert info.value.code == ErrorCode.INVALID_ARG


def test_wire_form_is_length_prefixed():
    out = cls.classify(tensor([2.0]), 1, (b"x",))
    assert bytes(out.data) == struct.pack("<I", 12) + b"2.000000:0:x"
