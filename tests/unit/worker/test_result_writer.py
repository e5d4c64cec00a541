"""The worker's answers (worker/result_writer.py): every output leaves as little-endian, C-ordered bytes at
the place its reference names, whichever way the writer takes (the small numeric array as it is, or
tensors.output_data's conversions: big-endian, non-contiguous, BF16, BYTES)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from inferd.worker.backends.base import ModelSpec, Request, Response, Tensor
from inferd.worker.result_writer import ResultWriter
from inferd.worker.wire import bytes_codec
from inferd.worker.wire import messages as m

OUTPUTS = [
    ("LE", "FP32", np.arange(6, dtype="<f4").reshape(2, 3)),
    ("BE", "FP32", np.arange(6, dtype=">f4").reshape(2, 3)),
    ("T", "INT32", np.arange(6, dtype="<i4").reshape(2, 3).T),  # not C-contiguous
    ("H", "BF16", np.array([0x3F80, 0x4000], dtype="<u2")),
    ("S", "BYTES", np.array([b"ab", b""], dtype=object)),
    ("E", "FP32", np.zeros((0, 3), dtype="<f4")),
    ("B", "UINT8", np.arange(70_000, dtype="u1")),  # a frame of its own
]


def expected_bytes(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return bytes_codec.serialize(array)
    return np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"))).tobytes()


@pytest.mark.parametrize("checks_outputs", [False, True])
def test_outputs_leave_as_little_endian_c_ordered_bytes(checks_outputs):
    config = {"name": "m", "backend": "python",
              "output": [{"name": name, "data_type": "TYPE_" + {"FP32": "FP32", "INT32": "INT32", "BF16": "BF16",
                                                                 "BYTES": "STRING", "UINT8": "UINT8"}[datatype],
                          "dims": list(array.shape)} for name, datatype, array in OUTPUTS]}
    writer = ResultWriter(lambda line: None)
    writer.configure(ModelSpec("m", "/nowhere", "1", json.dumps(config), "python"), checks_outputs)
    request = Request(7, "", [], [])
    response = Response([Tensor(name, datatype, array) for name, datatype, array in OUTPUTS])
    header, frames = writer.batch(3, [request], [request], [response], (0, 0, 0))
    message = m.decode_header(header)
    (item,) = message.responses
    assert item.error is None and [ref.name for ref in item.outputs] == [name for name, _, _ in OUTPUTS]
    for ref, (name, datatype, array) in zip(item.outputs, OUTPUTS):
        frame = memoryview(frames[ref.frame]).cast("B")
        got = bytes(frame[ref.offset:ref.offset + ref.nbytes]) if ref.nbytes or ref.offset else bytes(frame)
        assert list(ref.shape) == list(array.shape) and ref.datatype == datatype, name
        assert got == expected_bytes(datatype, array), name
    writer.close()


def test_output_checks_are_remembered_only_for_outputs_that_passed_as_they_were():
    """Framework backends' outputs are checked against the configuration; a (name, datatype, shape) that
    passed as it was needs no second check, but a failed or reshaped one is checked every time."""
    config = {"name": "m", "backend": "onnxruntime", "max_batch_size": 0,
              "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]},
                         {"name": "R", "data_type": "TYPE_FP32", "dims": [2, 2], "reshape": {"shape": [4]}}]}
    writer = ResultWriter(lambda line: None)
    writer.configure(ModelSpec("m", "/nowhere", "1", json.dumps(config), "onnxruntime"), True)
    request = Request(1, "", [], [])

    def answer(*outputs: Tensor) -> m.ResponseItem:
        header, _ = writer.batch(1, [request], [request], [Response(list(outputs))], (0, 0, 0))
        (item,) = m.decode_header(header).responses
        return item

    for _ in range(2):
        item = answer(Tensor("Y", "FP32", np.zeros(4, "<f4")), Tensor("R", "FP32", np.zeros(4, "<f4")))
        assert item.error is None and [list(ref.shape) for ref in item.outputs] == [[4], [2, 2]]
        for bad, message in ((Tensor("Y", "FP32", np.zeros(5, "<f4")), "has shape [5]"),
                             (Tensor("Y", "INT32", np.zeros(4, "<i4")), "has datatype INT32"),
                             (Tensor("Y", "FP32", [0.0] * 4), "AttributeError")):
            item = answer(bad)
            assert item.error is not None and message in item.error.message, item.error
    assert writer._passed == {("Y", "FP32", (4,))}
    writer.close()
