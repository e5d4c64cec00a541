"""HTTP and gRPC bound the tensors of one request by the same limit (inference/limits.py)."""

from __future__ import annotations

import json

import pytest
from inferd.supervisor.http_api.codec import InferCodec
from inferd.supervisor.inference.limits import MAX_TENSORS
from inferd.worker.wire.errors import InferdError

from .fake_dataplane import FakeDataPlane


def _parse(n_inputs: int, n_outputs: int = 0) -> int:
    doc = {"inputs": [{"name": f"I{i}", "datatype": "INT32", "shape": [1], "data": [i]} for i in range(n_inputs)],
           "outputs": [{"name": f"O{i}"} for i in range(n_outputs)]}
    body = json.dumps(doc).encode()
    return len(InferCodec(FakeDataPlane()).parse("m", "", {}, body).request.inputs)


def test_http_takes_as_many_inputs_and_outputs_as_grpc() -> None:
    assert _parse(MAX_TENSORS, MAX_TENSORS) == MAX_TENSORS  # HTTP refused more than 256 before


def test_http_refuses_one_input_over_the_limit() -> None:
    with pytest.raises(InferdError, match=f"at most {MAX_TENSORS}"):
        _parse(MAX_TENSORS + 1)


def test_http_refuses_one_output_over_the_limit() -> None:
    with pytest.raises(InferdError, match=f"at most {MAX_TENSORS}"):
        _parse(1, MAX_TENSORS + 1)
