"""Client shared memory off by default (as Triton 2.70+, `--allow-client-shm`): every shm endpoint answers as
Triton's does then (register and unregister 501 / UNIMPLEMENTED with its text, status empty, a named status
NOT_FOUND); on with `--allow-client-shm=true`, as perf_analyzer `--shared-memory system` uses it. Unmodified
tritonclient over HTTP and gRPC. Skipped against Triton 2.51, which predates the flag (shm always on)."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import target_is_triton
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.skipif(target_is_triton(), reason="Triton 2.51 has no --allow-client-shm (shm is on)")

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
SIZE = 64  # 16 FP32


@pytest.fixture
def region():
    key = "/inferd_test_c19_%d" % os.getpid()
    handle = shm.create_shared_memory_region("in0", key, SIZE)
    yield handle, key
    shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def disabled(module_server_factory):
    return module_server_factory(["add_sub"])


def _client(server, protocol):
    return server.http_client() if protocol == "http" else server.grpc_client()


def _refused(call, status: str) -> None:
    with pytest.raises(InferenceServerException) as err:
        call()
    assert err.value.message() == DISABLED
    assert err.value.status() == status


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_disabled_register_and_unregister_refused(disabled, region, protocol):
    _, key = region
    client = _client(disabled, protocol)
    status = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
    _refused(lambda: client.register_system_shared_memory("in0", key, SIZE), status)
    _refused(lambda: client.unregister_system_shared_memory("in0"), status)
    _refused(lambda: client.unregister_system_shared_memory(), status)
    handle = base64.b64encode(b"\0" * 64) if protocol == "http" else b"\0" * 64  # as cudashm.get_raw_handle
    _refused(lambda: client.register_cuda_shared_memory("c0", handle, 0, SIZE), status)
    _refused(lambda: client.unregister_cuda_shared_memory("c0"), status)
    _refused(lambda: client.unregister_cuda_shared_memory(), status)
    # status is answered, with no region
    if protocol == "http":
        assert client.get_system_shared_memory_status() == []
        assert client.get_cuda_shared_memory_status() == []
    else:
        assert len(client.get_system_shared_memory_status().regions) == 0
        assert len(client.get_cuda_shared_memory_status().regions) == 0
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'in0'"):
        client.get_system_shared_memory_status("in0")
    client.close()


def test_disabled_raw_http_statuses(disabled):
    code, body = disabled.post("/v2/systemsharedmemory/region/in0/unregister")
    assert (code, json.loads(body)) == (501, {"error": DISABLED})
    code, body = disabled.post("/v2/cudasharedmemory/unregister")
    assert (code, json.loads(body)) == (501, {"error": DISABLED})
    for body_sent in (b"not json", json.dumps({"key": "/x", "byte_size": 8}).encode()):
        code, body = disabled.post("/v2/systemsharedmemory/region/in0/register", body_sent)
        assert (code, json.loads(body)) == (501, {"error": DISABLED})
    code, body = disabled.post("/v2/cudasharedmemory/region/c0/register", b"{}")
    assert (code, json.loads(body)) == (501, {"error": DISABLED})
    code, body = disabled.get("/v2/systemsharedmemory/region/in0/status")
    assert code == 404 and "Unable to find system shared memory region: 'in0'" in json.loads(body)["error"]


def test_disabled_tensor_in_shm_finds_no_region(disabled):
    client = disabled.http_client()
    inputs = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_shared_memory("in0", SIZE)
    inputs[1].set_data_from_numpy(np.ones(16, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'in0'"):
        client.infer("add_sub", inputs)
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_enabled_round_trip(server_factory, region, protocol):
    handle, key = region
    server = server_factory(["add_sub"], extra_args=["--allow-client-shm=true"])
    a = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(handle, [a])
    mod = httpclient if protocol == "http" else grpcclient
    client = _client(server, protocol)
    client.register_system_shared_memory("in0", key, SIZE)
    inputs = [mod.InferInput("INPUT0", [16], "FP32"), mod.InferInput("INPUT1", [16], "FP32")]
    inputs[0].set_shared_memory("in0", SIZE)
    inputs[1].set_data_from_numpy(np.ones(16, dtype=np.float32))
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []
    client.close()
