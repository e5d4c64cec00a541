"""Client system shared memory as Triton's qa L0_shared_memory checks it (v2.51.0, issue 43 item 10), with
unmodified tritonclient over HTTP and gRPC:

- a region that a request in flight names (input or output) cannot be unregistered (qa
  TestSharedMemoryUnregister): "Cannot unregister shared memory region '<n>', it is currently in use.", and
  unregistering all of them names the held ones ("Failed to unregister the following system shared memory
  regions: a ,b ,"); inferd unregistered them, and the request's outputs then had nowhere to go. Once the
  answer is written they unregister as usual. Also with --frontend-processes 2 (the core, which
  unregisters, holds what the frontends read).
  inferd only: the reference Triton 2.51 binary here (nvidia-pytriton 0.7.0) unregisters them anyway,
  although v2.51.0's source and qa refuse; Triton 2.53 and later accept the unregister and drop the region
  when the request is done.
- offsets and sizes out of bounds get Triton's messages (qa test_infer_offset_out_of_bound,
  test_infer_byte_size_out_of_bound): an HTTP offset of 2**64 - 32 (a negative number's 64-bit wrap), a gRPC
  offset of -32 or of the region's size, an offset + byte size past its end, for inputs and outputs, checked
  before the tensor's own size; inferd answered with its own words (and took an output window past the
  region's end). These pass against Triton 2.51.

Fixture model: shm_gate (qa's "simple": INT32 [16] add and subtract, held at a gate when asked).
"""

from __future__ import annotations

import uuid
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

SIZE = 64  # 16 INT32
NAMES = ("input0_data", "input1_data", "output0_data", "output1_data")
WAIT_S = 60.0


@pytest.fixture
def regions():
    """The four regions of qa's tests (and a spare), created with inputs 0..15 and 1s; destroyed after."""
    tag = uuid.uuid4().hex[:8]
    handles = {n: shm.create_shared_memory_region(n, f"/{n}_{tag}", SIZE) for n in (*NAMES, "spare")}
    shm.set_shared_memory_region(handles["input0_data"], [np.arange(16, dtype=np.int32)])
    shm.set_shared_memory_region(handles["input1_data"], [np.ones(16, dtype=np.int32)])
    yield {n: f"/{n}_{tag}" for n in handles}, handles
    for h in handles.values():
        shm.destroy_shared_memory_region(h)


def _register(client, keys: dict[str, str]) -> None:
    client.unregister_system_shared_memory()
    for name, key in keys.items():
        client.register_system_shared_memory(name, key, SIZE)


def _request(mod, out_offset: int = 0, out_size: int = SIZE, in_offset: int = 0, in_size: int = SIZE):
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input0_data", in_size, offset=in_offset)
    inputs[1].set_shared_memory("input1_data", SIZE)
    if mod is httpclient:
        outputs = [mod.InferRequestedOutput("OUTPUT0", binary_data=True),
                   mod.InferRequestedOutput("OUTPUT1", binary_data=False)]
    else:
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", out_size, offset=out_offset)
    outputs[1].set_shared_memory("output1_data", SIZE)
    return inputs, outputs


def _held_regions_refused(server) -> None:
    """What qa's _test_unregister_shm_fail checks, from a second client."""
    other = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            other.unregister_system_shared_memory()
        assert ("Failed to unregister the following system shared memory regions: input0_data ,input1_data "
                ",output0_data ,output1_data ,") in str(info.value)
        for name in NAMES:
            with pytest.raises(InferenceServerException) as info:
                other.unregister_system_shared_memory(name)
            assert f"Cannot unregister shared memory region '{name}', it is currently in use." in str(info.value)
        # the held ones stay; the free one went with the first call
        assert sorted(r["name"] for r in other.get_system_shared_memory_status()) == sorted(NAMES)
    finally:
        other.close()


def _all_gone(server) -> None:
    other = httpclient.InferenceServerClient(server.http_url)
    try:
        for name in NAMES:
            with pytest.raises(InferenceServerException) as info:
                other.get_system_shared_memory_status(name)
            assert f"Unable to find system shared memory region: '{name}'" in str(info.value)
    finally:
        other.close()


def _wait_started(harness, gate) -> None:
    harness.wait_for(lambda: (gate / "started").exists(), WAIT_S, "the request to reach the model")


@pytest.mark.inferd_only
@pytest.mark.parametrize("frontends", ["1", "2"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unregister_during_inference_is_refused(server_factory, harness, regions, tmp_path, protocol, frontends):
    keys, handles = regions
    server = server_factory(["shm_gate"], inferd_args=["--allow-client-shm", "true",
                                                       "--frontend-processes", frontends])
    http = server.http_client()
    _register(http, keys)
    gate = tmp_path / "gate"
    gate.mkdir()
    if protocol == "http":
        inputs, outputs = _request(httpclient)
        pending = http.async_infer("shm_gate", inputs, outputs=outputs, parameters={"gate_dir": str(gate)})
    else:
        grpc = server.grpc_client()
        results: list = []
        inputs, outputs = _request(grpcclient)
        grpc.async_infer("shm_gate", inputs, partial(lambda out, result, error: out.append(error or result), results),
                         outputs=outputs, parameters={"gate_dir": str(gate)})
    try:
        _wait_started(harness, gate)
        _held_regions_refused(server)
    finally:
        (gate / "release").touch()
    if protocol == "http":
        result = pending.get_result()
    else:
        harness.wait_for(lambda: results, WAIT_S, "the gRPC answer")
        result = results[0]
        assert not isinstance(result, Exception), result
    assert result.get_output("OUTPUT0") is not None
    got = shm.get_contents_as_numpy(handles["output0_data"], np.int32, [1, 16])
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.int32).reshape(1, 16) + 1)
    # answered: free to unregister
    http.unregister_system_shared_memory()
    _all_gone(server)
    http.close()


@pytest.mark.inferd_only
def test_a_request_refused_after_reading_lets_its_regions_go(server_factory, regions):
    """A request that fails after its regions were read (an output window out of bounds) holds nothing."""
    keys, _ = regions
    server = server_factory(["shm_gate"], inferd_args=["--allow-client-shm", "true"])
    http = server.http_client()
    _register(http, keys)
    inputs, outputs = _request(httpclient, out_offset=60)
    with pytest.raises(InferenceServerException):
        http.infer("shm_gate", inputs, outputs=outputs)
    http.unregister_system_shared_memory()
    _all_gone(server)
    http.close()


@pytest.fixture(scope="module")
def shm_server(module_server_factory):
    return module_server_factory(["shm_gate"], inferd_args=["--allow-client-shm", "true"])


# (protocol, which tensor, offset, byte size, message): Triton 2.51's answers (qa and asked here)
BOUNDS = [
    ("http", "out", 2**64 - 32, SIZE, "Invalid offset for shared memory region: 'output0_data'"),
    ("http", "in", 2**64 - 32, SIZE, "Invalid offset for shared memory region: 'input0_data'"),
    ("http", "out", 2**63, SIZE, "Invalid offset for shared memory region: 'output0_data'"),
    ("http", "out", 60, SIZE, "Invalid offset + byte size for shared memory region: 'output0_data'"),
    ("http", "in", 0, SIZE + 1, "Invalid offset + byte size for shared memory region: 'input0_data'"),
    ("http", "out", 0, SIZE + 1, "Invalid offset + byte size for shared memory region: 'output0_data'"),
    ("http", "out", 8, 2**64 - 8, "Invalid offset + byte size for shared memory region: 'output0_data'"),
    ("grpc", "out", SIZE, SIZE, "Invalid offset for shared memory region: 'output0_data'"),
    ("grpc", "out", -32, SIZE, "Invalid offset for shared memory region: 'output0_data'"),
    ("grpc", "in", -32, SIZE, "Invalid offset for shared memory region: 'input0_data'"),
    ("grpc", "in", 60, SIZE, "Invalid offset + byte size for shared memory region: 'input0_data'"),
    ("grpc", "out", 0, -1, "Invalid offset + byte size for shared memory region: 'output0_data'"),
    ("grpc", "in", 0, SIZE + 1, "Invalid offset + byte size for shared memory region: 'input0_data'"),
]


@pytest.mark.parametrize("protocol,which,offset,size,message", BOUNDS)
def test_out_of_bounds_gets_tritons_message(shm_server, regions, protocol, which, offset, size, message):
    keys, _ = regions
    http = shm_server.http_client()
    _register(http, keys)
    mod = httpclient if protocol == "http" else grpcclient
    client = http if protocol == "http" else shm_server.grpc_client()
    if which == "in":
        inputs, outputs = _request(mod, in_offset=offset, in_size=size)
    else:
        inputs, outputs = _request(mod, out_offset=offset, out_size=size)
    with pytest.raises(InferenceServerException) as info:
        client.infer("shm_gate", inputs, outputs=outputs)
    assert message in str(info.value)
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # the regions are still fine
    inputs, outputs = _request(mod)
    client.infer("shm_gate", inputs, outputs=outputs)
    http.unregister_system_shared_memory()
    http.close()

