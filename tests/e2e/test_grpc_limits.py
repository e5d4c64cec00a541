"""The gRPC message cap: --grpc-max-message-size, by default the HTTP body cap plus 1 MiB, on both gRPC
servers; a message over it is RESOURCE_EXHAUSTED and the server goes on serving."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

MIB = 1024 * 1024


def _infer(server, elements: int):
    import tritonclient.grpc as grpcclient

    data = np.arange(elements, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [elements], "FP32")
    inp.set_data_from_numpy(data)
    with server.grpc_client() as client:
        out = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    assert np.array_equal(out, data)


@pytest.mark.parametrize("impl", ["native", "grpcio"])
@pytest.mark.parametrize("flags, cap", [
    (["--grpc-max-message-size", str(MIB)], MIB),
    (["--http-max-input-size", str(2 * MIB)], 3 * MIB),  # the default follows the HTTP body cap
])
def test_a_message_over_the_cap_is_resource_exhausted(server_factory, impl, flags, cap):
    server = server_factory(["identity_fp32"], inferd_args=["--grpc-server", impl, *flags])
    _infer(server, (cap - 64 * 1024) // 4)  # just under: served
    with pytest.raises(InferenceServerException) as err:
        _infer(server, (cap + 64 * 1024) // 4)
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    _infer(server, 4)  # still serving
