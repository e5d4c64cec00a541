"""Every datatype round trip through the `identity` model: HTTP JSON, HTTP binary, gRPC, gRPC aio.

Also BF16 (ml_dtypes) through binary transports, requested-output subsets, empty and large tensors.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient

MODELS = ["identity", "identity_bf16", "identity_fp32"]
TIMEOUT_S = 30.0

DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
TRANSPORTS = ["http-json", "http-binary", "grpc", "grpc-aio"]


@pytest.fixture(scope="module")
def server(module_server_factory):
    # identity_bf16 is awaited by its own tests, so a server without BF16 fails only those.
    return module_server_factory(MODELS, wait_ready=["identity", "identity_fp32"])


def sample(triton_dtype: str, n: int = 7, *, json_safe: bool = False, seed: int = 0) -> np.ndarray:
    """n elements including each type's extremes."""
    rng = np.random.default_rng(seed)
    np_dtype = DTYPES[triton_dtype]
    if triton_dtype == "BOOL":
        return (np.arange(n) % 3 == 0).astype(np.bool_)
    if triton_dtype == "BYTES":
        items = [b"", b"hello", "h\u00e9llo w\u00f6rld".encode(), b"x" * 300, b"tab\tnew\nline", b"end", b"7"]
        if not json_safe:
            items[3] = bytes(range(256)) + b"\x00\xff"
        return np.array((items * n)[:n], dtype=np.object_)
    if np.issubdtype(np_dtype, np.integer):
        info = np.iinfo(np_dtype)
        vals = rng.integers(info.min, info.max, size=n, dtype=np_dtype, endpoint=True)
        vals[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
        return vals
    vals = rng.standard_normal(n).astype(np_dtype) * np_dtype(100)
    specials = [np.finfo(np_dtype).max, np.finfo(np_dtype).tiny, -0.0]
    vals[: min(n, 3)] = specials[: min(n, 3)]
    return vals


def all_inputs(json_safe: bool, n: int = 7) -> dict[str, np.ndarray]:
    return {dt: sample(dt, n, json_safe=json_safe, seed=i) for i, dt in enumerate(DTYPES)}


def _as_bytes(x) -> bytes:
    # tritonclient returns BYTES outputs that came back as JSON as str, binary ones as bytes
    return x.encode("utf-8") if isinstance(x, str) else bytes(x)


def assert_same(dt: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got is not None, f"OUTPUT_{dt} missing"
    assert list(got.shape) == list(want.shape), dt
    if dt == "BYTES":
        assert [_as_bytes(x) for x in got.reshape(-1)] == [_as_bytes(x) for x in want.reshape(-1)]
    else:
        assert got.dtype == want.dtype, (dt, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=dt)


def http_infer(server, data: dict[str, np.ndarray], binary: bool, outputs: list[str] | None = None,
               output_binary: dict[str, bool] | None = None):
    client = httpclient.InferenceServerClient(server.http_url, connection_timeout=10,
                                              network_timeout=TIMEOUT_S)
    try:
        inputs = []
        for dt, arr in data.items():
            inp = httpclient.InferInput(f"INPUT_{dt}", list(arr.shape), dt)
            # FP16 (and BF16) cannot travel as JSON: binary is the only encoding for them
            inp.set_data_from_numpy(arr, binary_data=binary or dt in ("FP16", "BF16"))
            inputs.append(inp)
        requested = None
        if outputs is not None:
            requested = []
            for dt in outputs:
                want_binary = binary or dt == "FP16"
                if output_binary and dt in output_binary:
                    want_binary = output_binary[dt]
                requested.append(httpclient.InferRequestedOutput(f"OUTPUT_{dt}", binary_data=want_binary))
        elif not binary:
            requested = [httpclient.InferRequestedOutput(f"OUTPUT_{dt}", binary_data=dt == "FP16")
                         for dt in data]
        return client.infer("identity", inputs, outputs=requested)
    finally:
        client.close()


def grpc_inputs(data: dict[str, np.ndarray]) -> list:
    inputs = []
    for dt, arr in data.items():
        inp = grpcclient.InferInput(f"INPUT_{dt}", list(arr.shape), dt)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def grpc_infer(server, data: dict[str, np.ndarray], outputs: list[str] | None = None):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        requested = [grpcclient.InferRequestedOutput(f"OUTPUT_{dt}") for dt in outputs] if outputs else None
        return client.infer("identity", grpc_inputs(data), outputs=requested, client_timeout=TIMEOUT_S)
    finally:
        client.close()


def grpc_aio_infer(server, data: dict[str, np.ndarray]):
    async def run():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            return await client.infer("identity", grpc_inputs(data), client_timeout=TIMEOUT_S)
        finally:
            await client.close()

    return asyncio.run(run())


def infer(server, transport: str, data: dict[str, np.ndarray]):
    if transport == "http-json":
        return http_infer(server, data, binary=False)
    if transport == "http-binary":
        return http_infer(server, data, binary=True)
    if transport == "grpc":
        return grpc_infer(server, data)
    return grpc_aio_infer(server, data)


def output_names(result) -> list[str]:
    response = result.get_response()
    if isinstance(response, dict):
        return [o["name"] for o in response["outputs"]]
    return [o.name for o in response.outputs]


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_datatype_round_trip(server, transport):
    data = all_inputs(json_safe=transport == "http-json")
    result = infer(server, transport, data)
    for dt, arr in data.items():
        assert_same(dt, result.as_numpy(f"OUTPUT_{dt}"), arr)
    assert sorted(output_names(result)) == sorted(f"OUTPUT_{dt}" for dt in DTYPES)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_empty_tensors(server, transport):
    data = {dt: np.zeros([0], dtype=DTYPES[dt]) for dt in DTYPES}
    result = infer(server, transport, data)
    for dt in data:
        got = result.as_numpy(f"OUTPUT_{dt}")
        assert got is not None and got.shape == (0,), dt


def test_http_json_response_encoding(server):
    """JSON outputs come back in `data` (no binary_data_size) and BOOL/BYTES as JSON values."""
    data = all_inputs(json_safe=True, n=3)
    result = http_infer(server, data, binary=False)
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert by_name["OUTPUT_BOOL"]["data"] == [bool(x) for x in data["BOOL"]]
    assert by_name["OUTPUT_BYTES"]["data"] == [x.decode() for x in data["BYTES"]]
    assert by_name["OUTPUT_INT64"]["data"] == [int(x) for x in data["INT64"]]
    assert by_name["OUTPUT_INT32"]["datatype"] == "INT32"
    assert by_name["OUTPUT_INT32"]["shape"] == [3]
    assert "binary_data_size" not in by_name["OUTPUT_INT32"].get("parameters", {})
    assert by_name["OUTPUT_FP16"]["parameters"]["binary_data_size"] == 6


def test_bytes_many_elements(server):
    items = np.array([f"item-{i}".encode() * (i % 5) for i in range(2000)], dtype=np.object_)
    for transport in ("http-binary", "grpc"):
        result = infer(server, transport, {**all_inputs(False, n=1), "BYTES": items})
        assert_same("BYTES", result.as_numpy("OUTPUT_BYTES"), items)


# ---------------------------------------------------------------------------- requested outputs


def test_requested_output_subset_http(server):
    data = all_inputs(json_safe=False)
    result = http_infer(server, data, binary=True, outputs=["INT32", "BYTES"])
    assert sorted(output_names(result)) == ["OUTPUT_BYTES", "OUTPUT_INT32"]
    assert_same("INT32", result.as_numpy("OUTPUT_INT32"), data["INT32"])
    assert_same("BYTES", result.as_numpy("OUTPUT_BYTES"), data["BYTES"])
    assert result.as_numpy("OUTPUT_FP32") is None


def test_requested_output_mixed_binary_and_json(server):
    data = all_inputs(json_safe=True)
    result = http_infer(server, data, binary=True, outputs=["FP32", "INT8", "BOOL"],
                        output_binary={"FP32": True, "INT8": False, "BOOL": False})
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert set(by_name) == {"OUTPUT_FP32", "OUTPUT_INT8", "OUTPUT_BOOL"}
    assert by_name["OUTPUT_FP32"]["parameters"]["binary_data_size"] == 4 * 7
    assert by_name["OUTPUT_INT8"]["data"] == [int(x) for x in data["INT8"]]
    for dt in ("FP32", "INT8", "BOOL"):
        assert_same(dt, result.as_numpy(f"OUTPUT_{dt}"), data[dt])


def test_requested_output_subset_grpc(server):
    data = all_inputs(json_safe=False)
    result = grpc_infer(server, data, outputs=["UINT64", "FP16"])
    assert sorted(output_names(result)) == ["OUTPUT_FP16", "OUTPUT_UINT64"]
    assert_same("UINT64", result.as_numpy("OUTPUT_UINT64"), data["UINT64"])
    assert_same("FP16", result.as_numpy("OUTPUT_FP16"), data["FP16"])
    # Triton always sends outputs as raw_output_contents, one entry per output
    assert len(result.get_response().raw_output_contents) == 2


# ---------------------------------------------------------------------------- large tensors


@pytest.mark.parametrize("transport", ["http-binary", "grpc"])
def test_large_fp32_round_trip(server, transport):
    data = np.random.default_rng(7).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    if transport == "http-binary":
        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=10,
                                                  network_timeout=TIMEOUT_S)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        try:
            result = client.infer("identity_fp32", [inp])
        finally:
            client.close()
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        try:
            result = client.infer("identity_fp32", [inp], client_timeout=TIMEOUT_S)
        finally:
            client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


# ---------------------------------------------------------------------------- BF16


@pytest.mark.parametrize("transport", ["http-binary", "grpc"])
def test_bf16_round_trip(server, transport):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    server.wait_model_ready("identity_bf16", timeout=30)
    data = np.array([1.5, -2.0, 3.25, 0.0, 1e30, -1e-30], dtype=ml_dtypes.bfloat16)
    if transport == "http-binary":
        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=10,
                                                  network_timeout=TIMEOUT_S)
        inp = httpclient.InferInput("INPUT0", list(data.shape), "BF16")
        inp.set_data_from_numpy(data, binary_data=True)
        try:
            result = client.infer("identity_bf16", [inp])
        finally:
            client.close()
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "BF16")
        inp.set_data_from_numpy(data)
        try:
            result = client.infer("identity_bf16", [inp], client_timeout=TIMEOUT_S)
        finally:
            client.close()
    got = result.as_numpy("OUTPUT0")
    assert got.dtype == data.dtype
    assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()
