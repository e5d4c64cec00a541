"""CUDA shared-memory registration on a host without a GPU answers as Triton 2.51 does (checked against
the real Triton: INFERD_E2E_TARGET=triton runs this file against it), over HTTP and gRPC with unmodified
tritonclient; and the cuda_shared_memory extension is not advertised where it cannot work."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from tritonclient.utils import InferenceServerException

INVALID = "failed to register shared memory region: invalid args"
HANDLE = base64.b64encode(b"\0" * 64).decode()
BAD_HANDLE = "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory([], inferd_args=["--allow-client-shm", "true"])


def _post(server, path: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(server.http_base + path, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()).get("error", "")


def _register(server, body: dict, name: str = "r") -> tuple[int, str]:
    return _post(server, f"/v2/cudasharedmemory/region/{name}/register", json.dumps(body).encode())


def test_http_registration_without_a_gpu(server) -> None:
    assert _register(server, {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 16}) == (400, INVALID)
    assert _register(server, {"raw_handle": {"b64": HANDLE}, "device_id": 3, "byte_size": 16}) == (400, INVALID)
    assert _register(server, {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 0}) == (400, INVALID)
    assert _register(server, {"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 16}) == (400, BAD_HANDLE)
    assert _register(server, {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16}) == (400, BAD_HANDLE)
    assert _register(server, {"device_id": 0, "byte_size": 16}) == (
        400, "Shared memory register request has no 'raw_handle' field")
    assert _post(server, "/v2/cudasharedmemory/register", b"{}") == (
        400, "'region name' is necessary to register cuda shared memory region")


def test_http_status_and_unregister_with_tritonclient(server) -> None:
    client = server.http_client()
    try:
        assert client.get_cuda_shared_memory_status() == []
        with pytest.raises(InferenceServerException) as info:
            client.get_cuda_shared_memory_status("foo")
        assert "Unable to find cuda shared memory region: 'foo'" in str(info.value)
        with pytest.raises(InferenceServerException) as info:
            client.register_cuda_shared_memory("foo", HANDLE, 0, 16)
        assert INVALID in str(info.value)
        client.unregister_cuda_shared_memory("foo")
        client.unregister_cuda_shared_memory()
    finally:
        client.close()


def test_grpc_registration_without_a_gpu(server) -> None:
    client = server.grpc_client()
    try:
        assert len(client.get_cuda_shared_memory_status().regions) == 0
        with pytest.raises(InferenceServerException) as info:
            client.get_cuda_shared_memory_status("foo")
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert info.value.message() == "Unable to find cuda shared memory region: 'foo'"
        for name, raw, device, size in [("foo", HANDLE, 0, 16), ("foo", base64.b64encode(b"abc"), 0, 16),
                                        ("", HANDLE, 0, 16), ("foo", HANDLE, 7, 16), ("foo", HANDLE, 0, 0)]:
            with pytest.raises(InferenceServerException) as info:
                client.register_cuda_shared_memory(name, raw, device, size)
            assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", INVALID)
        client.unregister_cuda_shared_memory("foo")
        client.unregister_cuda_shared_memory()
    finally:
        client.close()


@pytest.mark.inferd_only  # the CPU build of Triton advertises it although it cannot work
def test_cuda_shared_memory_not_advertised_without_a_gpu(server) -> None:
    client = server.http_client()
    try:
        extensions = client.get_server_metadata()["extensions"]
    finally:
        client.close()
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
