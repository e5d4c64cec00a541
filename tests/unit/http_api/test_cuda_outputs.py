"""Outputs into CUDA regions in the frontends: a request whose every output goes to a CUDA region asks for
device outputs (InferRequest.device_outputs), over HTTP (fresh parse and header template) and gRPC; a
device output (Tensor.device_ref) is handed to the data plane's shm_write as it is, never read as bytes;
one that does not fit its region is a 400 naming the region."""

from __future__ import annotations

import json
from typing import Any

import pytest
from inferd.supervisor._gen import grpc_service_pb2 as pb
from inferd.supervisor.grpc_api import convert, wire
from inferd.supervisor.http_api.codec import InferCodec
from inferd.supervisor.inference.types import InferResponse, Tensor
from inferd.worker.wire.errors import InferdError

from .fake_dataplane import FakeDataPlane


class DeviceRef:  # the fields of memory.device_refs.DeviceRef the frontends read
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class CudaRegionsPlane(FakeDataPlane):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, int, Any]] = []

    def shm_is_cuda(self, region: str) -> bool:
        return region.startswith("gpu")

    def shm_write(self, region: str, offset: int, data: Any) -> None:
        self.writes.append((region, offset, data))


def _http(outputs: list[dict[str, Any]]) -> tuple[dict[str, str], bytes]:
    head = json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1],
                                   "parameters": {"binary_data_size": 4}}], "outputs": outputs}).encode()
    return {"inference-header-content-length": str(len(head))}, head + bytes(4)


def _out(name: str, region: str, size: int = 64) -> dict[str, Any]:
    return {"name": name, "parameters": {"shared_memory_region": region, "shared_memory_byte_size": size}}


def test_http_asks_for_device_outputs_only_when_every_output_is_in_a_cuda_region() -> None:
    codec = InferCodec(CudaRegionsPlane())
    for _ in range(2):  # the second parse comes from the header template
        headers, body = _http([_out("A", "gpu_a"), _out("B", "gpu_b")])
        assert codec.parse("m", "", headers, body).request.device_outputs
    for outputs in ([_out("A", "gpu_a"), {"name": "B"}], [_out("A", "gpu_a"), _out("B", "host_b")], []):
        headers, body = _http(outputs)
        assert not codec.parse("m", "", headers, body).request.device_outputs, outputs


def test_http_writes_a_device_output_by_reference() -> None:
    dp = CudaRegionsPlane()
    codec = InferCodec(dp)
    headers, body = _http([_out("A", "gpu_a", 64)])
    parsed = codec.parse("m", "", headers, body)
    ref = DeviceRef(64)
    resp = InferResponse("m", "1", outputs=[Tensor("A", "FP32", [16], b"", device_ref=ref)])
    answer = json.loads(bytes(codec.build(parsed, resp).body))
    assert dp.writes == [("gpu_a", 0, ref)]
    assert answer["outputs"] == [{"name": "A", "datatype": "FP32", "shape": [16]}]
    too_big = InferResponse("m", "1", outputs=[Tensor("A", "FP32", [32], b"", device_ref=DeviceRef(128))])
    with pytest.raises(InferdError) as info:
        codec.build(parsed, too_big)
    assert "'gpu_a'" in info.value.message and info.value.code == 3


def _grpc_request(*regions: str) -> Any:
    msg = pb.ModelInferRequest(model_name="m")
    inp = msg.inputs.add(name="IN", datatype="FP32", shape=[1])
    inp.contents.fp32_contents.append(1.0)
    for i, region in enumerate(regions):
        out = msg.outputs.add(name=f"O{i}")
        if region:
            out.parameters["shared_memory_region"].string_param = region
            out.parameters["shared_memory_byte_size"].int64_param = 64
    return convert.from_message(msg)


def test_grpc_asks_for_device_outputs_and_writes_them_by_reference() -> None:
    dp = CudaRegionsPlane()
    req, shm_out = convert.to_core(_grpc_request("gpu_a", "gpu_b"), dp)
    assert req.device_outputs
    for regions in (("gpu_a", ""), ("gpu_a", "host_b")):
        assert not convert.to_core(_grpc_request(*regions), dp)[0].device_outputs, regions
    ref = DeviceRef(64)
    resp = InferResponse("m", "1", outputs=[Tensor("O0", "FP32", [16], b"", device_ref=ref),
                                            Tensor("O1", "FP32", [1], b"\0\0\x80\x3f")])
    wire.response_parts(resp, shm_out, dp)
    assert dp.writes[0] == ("gpu_a", 0, ref) and dp.writes[1][0] == "gpu_b"
