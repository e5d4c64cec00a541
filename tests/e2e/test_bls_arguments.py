"""pb_utils.InferenceRequest takes what python_backend's pybind11 bindings take: bytes or numpy str names
(as `as_numpy()` of a BYTES tensor gives them, in python_backend's own bls example), tuples or arrays of
output names, numpy integers for model_version / timeout / flags. Unmodified tritonclient; passes
against the real Triton too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ACCEPTED = ["bytes_name", "numpy_str_name", "tuple_outputs", "array_outputs", "bytes_outputs", "numpy_ints",
            "bytes_request_id", "tuple_inputs", "str_correlation_id", "async"]
X = np.arange(16, dtype=np.float32)


@pytest.fixture(scope="module")
def client(module_server_factory):
    server = module_server_factory(["bls_args", "add_sub", "decoupled_cancel"])
    c = server.http_client()
    yield c
    c.close()


def _call(client, variant: str, name: bytes = b"add_sub"):
    inputs = [httpclient.InferInput("MODEL_NAME", [1], "BYTES"), httpclient.InferInput("X", [16], "FP32")]
    inputs[0].set_data_from_numpy(np.array([name], dtype=np.object_))
    inputs[1].set_data_from_numpy(X)
    return client.infer("bls_args", inputs, parameters={"variant": variant})


@pytest.mark.parametrize("variant", ACCEPTED)
def test_accepted_argument_types(client, variant):
    np.testing.assert_array_equal(_call(client, variant).as_numpy("Y"), X + X)


@pytest.mark.parametrize("variant, refusal", [("float_version", "TypeError"),
                                              ("bytes_correlation_id", "Correlation ID must be integer or string")])
def test_refused_argument_types(client, variant, refusal):
    with pytest.raises(InferenceServerException, match=refusal):
        _call(client, variant)


def test_unknown_model_named_by_bytes_is_the_callees_error(client):
    with pytest.raises(InferenceServerException, match="no_such_model"):
        _call(client, "bytes_name", b"no_such_model")


@pytest.mark.inferd_only  # ResponseIterator.cancel() came to python_backend after Triton 2.51
def test_decoupled_bls_iterator_cancel(client):
    """After cancel() the stream ends (with a cancellation error) instead of running on for a minute."""
    with pytest.raises(InferenceServerException, match="first had SUM: True; ended with: .*cancelled"):
        _call(client, "iterator_cancel")
