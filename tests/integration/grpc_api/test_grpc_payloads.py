"""Compressed and large payloads through the unmodified tritonclient.grpc, both gRPC implementations."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def client(grpc_url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(grpc_url)
    yield c
    c.close()


def _input(data: np.ndarray, name: str = "INPUT0") -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(data.shape), "UINT8" if data.dtype == np.uint8 else "FP32")
    inp.set_data_from_numpy(data)
    return inp


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_round_trip(client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    rng = np.random.default_rng(1)
    for data in (
        np.zeros(1 << 20, dtype=np.uint8),  # compresses ~1000x
        rng.integers(0, 256, 300_000, dtype=np.uint8),  # does not compress
        np.arange(4, dtype=np.uint8),
    ):
        res = client.infer("identity", [_input(data)], compression_algorithm=algorithm)
        assert np.array_equal(res.as_numpy("OUTPUT0"), data)
    a, b = np.ones((2, 4), np.float32), np.full((2, 4), 2.0, np.float32)
    res = client.infer("add_sub", [_input(a), _input(b, "INPUT1")], compression_algorithm=algorithm, request_id="z")
    assert np.array_equal(res.as_numpy("OUTPUT1"), a - b) and res.get_response().id == "z"
    done: queue.Queue = queue.Queue()
    client.async_infer(
        "identity",
        [_input(np.arange(9, dtype=np.uint8))],
        lambda result, error: done.put((result, error)),
        compression_algorithm=algorithm,
    )
    result, error = done.get(timeout=60)
    assert error is None and list(result.as_numpy("OUTPUT0")) == list(range(9))
    with pytest.raises(InferenceServerException) as err:  # errors still come back as statuses
        client.infer("nope", [_input(data)], compression_algorithm=algorithm)
    assert "INVALID_ARGUMENT" in str(err.value.status())


def test_20_mib_input_and_output(client: grpcclient.InferenceServerClient) -> None:
    data = np.random.default_rng(2).integers(0, 256, 20 * 1024 * 1024, dtype=np.uint8)
    for _ in range(2):
        res = client.infer("identity", [_input(data)], client_timeout=120)
        assert np.array_equal(res.as_numpy("OUTPUT0"), data)
    zeros = np.zeros(20 * 1024 * 1024, dtype=np.uint8)
    res = client.infer("identity", [_input(zeros)], compression_algorithm="gzip", client_timeout=120)
    assert np.array_equal(res.as_numpy("OUTPUT0"), zeros)


def test_a_very_long_error_message_reaches_the_client_truncated(native_url: str) -> None:
    # grpc.aio sends the whole text and the client refuses trailers that large (RESOURCE_EXHAUSTED)
    c = grpcclient.InferenceServerClient(native_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            c.infer("m" * 40000, [_input(np.arange(4, dtype=np.uint8))])
        assert err.value.status() != "StatusCode.RESOURCE_EXHAUSTED"
        assert "(truncated)" in err.value.message()
        assert c.is_server_live()
    finally:
        c.close()
