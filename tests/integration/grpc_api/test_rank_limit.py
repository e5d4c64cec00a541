"""gRPC bounds a tensor's rank by inference/limits.MAX_DIMS, as HTTP does (both gRPC servers; the raw
and the shared-memory paths): one dimension over it is INVALID_ARGUMENT naming the tensor and the limit;
a tensor at the limit is served."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from inferd.supervisor.inference.limits import MAX_DIMS
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def client(grpc_url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(grpc_url)
    yield c
    c.close()


def _input(rank: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    inp.set_shape([1] * rank)  # numpy itself stops at 64 dimensions
    return inp


def test_a_tensor_at_the_rank_limit_is_served(client: grpcclient.InferenceServerClient) -> None:
    res = client.infer("identity", [_input(MAX_DIMS)])
    assert res.as_numpy("OUTPUT0").shape == (1,) * MAX_DIMS


def test_one_dimension_over_the_limit_is_refused_naming_tensor_and_limit(
        client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [_input(MAX_DIMS + 1)])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    message = err.value.message()
    assert "'INPUT0'" in message and f"{MAX_DIMS + 1} dimensions" in message and f"at most {MAX_DIMS}" in message


def test_the_limit_holds_for_a_tensor_in_shared_memory(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [1] * (MAX_DIMS + 1), "FP32")
    inp.set_shared_memory("nowhere", 4)  # refused on its shape before the region is looked up
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity", [inp])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"at most {MAX_DIMS}" in err.value.message()
