"""Large tensors through BLS (issue 28 item 8): a Python model sends a tensor to another model and gets
it back, by exec() and by an iterated exec(decoupled=True) into a decoupled model; nothing refuses the
size and no watchdog kills a worker busy copying or comparing it. 1 GiB is `slow`; 300 MiB runs by
default. Unmodified tritonclient; passes against the real Triton too (INFERD_E2E_TARGET=triton)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

MODELS = ["bls_big", "big_identity", "big_identity_stream"]


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(MODELS)


def _round_trip(server, mib, decoupled):
    client = server.http_client(network_timeout=300.0)
    try:
        tensor = httpclient.InferInput("MIB", [1], "INT64")
        tensor.set_data_from_numpy(np.array([mib], np.int64))
        result = client.infer("bls_big", [tensor], parameters={"decoupled": int(decoupled)})
        return result.as_numpy("OUT").tolist()
    finally:
        client.close()


@pytest.mark.parametrize("decoupled", [False, True], ids=["exec", "exec_decoupled"])
def test_300_mib_through_bls(server, decoupled):
    assert _round_trip(server, 300, decoupled) == [300 << 20, 1]


@pytest.mark.slow
@pytest.mark.parametrize("decoupled", [False, True], ids=["exec", "exec_decoupled"])
def test_1_gib_through_bls(server, decoupled):
    assert _round_trip(server, 1024, decoupled) == [1 << 30, 1]
    for name in MODELS:  # every worker lived through it
        assert server.model_ready(name)
