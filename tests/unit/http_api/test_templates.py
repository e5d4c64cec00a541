"""Binary-request header templates (http_api.templates): a header seen again parses to the same request."""

from __future__ import annotations

import json
import struct
from typing import Any

from inferd.supervisor.http_api.codec import InferCodec, ParsedInfer

from .fake_dataplane import FakeDataPlane


def _body(header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, str], bytes]:
    head = json.dumps(header).encode()
    return {"inference-header-content-length": str(len(head))}, head + b"".join(blobs)


def _fields(p: ParsedInfer) -> tuple[Any, ...]:
    r = p.request
    return (r.model_name, r.model_version, r.id,
            [(t.name, t.datatype, t.shape, bytes(t.data), t.parameters, t.shm_ref) for t in r.inputs],
            [(o.name, o.parameters) for o in r.outputs], r.parameters, r.correlation_id, r.flags, r.priority,
            r.timeout_us, p.binary_default, {k: (v.binary, v.shm) for k, v in p.plans.items()})


HEADER = {"id": "r1", "parameters": {"custom": 1, "binary_data_output": True, "priority": 3, "sequence_id": 7},
          "inputs": [{"name": "IN0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16,
                                                                                      "extra": "x"}},
                     {"name": "IN1", "datatype": "INT32", "shape": [2], "data": [1, 2]}],
          "outputs": [{"name": "OUT0", "parameters": {"binary_data": False}}, {"name": "OUT1"}]}


def test_seen_header_gives_the_same_request_over_the_new_bytes() -> None:
    codec = InferCodec(FakeDataPlane())
    headers, first = _body(HEADER, [struct.pack("<4f", 1, 2, 3, 4)])
    codec.parse("m", "", headers, first)
    _, second = _body(HEADER, [struct.pack("<4f", 5, 6, 7, 8)])
    again = codec.parse("m", "", headers, second)
    fresh = InferCodec(FakeDataPlane()).parse("m", "", headers, second)
    assert len(codec._templates) == 1
    assert _fields(again) == _fields(fresh)


def test_changes_to_a_request_do_not_reach_the_next_one() -> None:
    codec = InferCodec(FakeDataPlane())
    headers, body = _body(HEADER, [bytes(16)])
    for _ in range(2):
        p = codec.parse("m", "", headers, body)
        p.request.parameters["added"] = True
        p.request.inputs[0].parameters["added"] = True
        p.request.inputs[0].shape.append(1)
        p.request.outputs[0].parameters["added"] = True
        p.plans.clear()
    assert _fields(codec.parse("m", "", headers, body)) == _fields(InferCodec(FakeDataPlane()).parse("m", "", headers,
                                                                                                      body))


def test_binary_bytes_inputs_are_not_remembered() -> None:
    codec = InferCodec(FakeDataPlane())
    header = {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 5}}]}
    headers, body = _body(header, [b"\x01\x00\x00\x00a"])
    codec.parse("m", "", headers, body)
    assert not codec._templates


def test_a_seen_header_over_a_chunked_body_view_gives_the_same_request() -> None:
    """A chunked body reaches the codec as a memoryview of a bytearray, not as bytes."""
    codec = InferCodec(FakeDataPlane())
    headers, first = _body(HEADER, [struct.pack("<4f", 1, 2, 3, 4)])
    codec.parse("m", "", headers, first)
    _, second = _body(HEADER, [struct.pack("<4f", 5, 6, 7, 8)])
    view = memoryview(bytearray(second) + b"spare")[: len(second)]
    again = codec.parse("m", "", headers, view)
    assert _fields(again) == _fields(InferCodec(FakeDataPlane()).parse("m", "", headers, second))
