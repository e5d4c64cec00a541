"""Malformed inference requests (reference/reliability.md §3.3 D5-D9, §4.2 items 18-19): 400/413, alive."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest

from .conftest import MAX_INPUT
from .rawhttp import error_of, request

SIMPLE = "/v2/models/simple/infer"
IDENT = "/v2/models/identity_FP32/infer"


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def fp32_input(shape: list[int], size: int, name: str = "INPUT0") -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": size}}


def post(served: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    status, _, raw = request(served.port, "POST", path, body, headers)
    return status, error_of(raw) if status != 200 else ""


def check_alive(served: Any) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()
    status, _, raw = request(served.port, "POST", IDENT, body)
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [1.0]


def _json_req(inp: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"inputs": [inp], **extra}).encode()


CASES: list[tuple[str, bytes, dict[str, str], str]] = [
    ("invalid json", b'{"inputs": [', {}, "failed to parse the request JSON"),
    ("empty body", b"", {}, "failed to parse the request JSON"),
    ("not an object", b"[1, 2]", {}, "must be a JSON object"),
    ("deep nesting", b"[" * 100000, {}, "failed to parse the request JSON"),
    ("deep data nesting", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":'
     + b"[" * 200 + b"1" + b"]" * 200 + b"}]}", {}, "nested too deeply"),
    # (NaN and Infinity literals are read, as Triton reads them: test_triton_parity.py)
    ("nan literal", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[nan]}]}', {},
     "failed to parse"),
    ("no inputs", b'{"id": "x"}', {}, "'inputs' array"),
    ("id not a string", b'{"id": 5, "inputs": []}', {}, "'id' must be a string"),
    ("shape as string", _json_req({"name": "INPUT0", "shape": "4", "datatype": "FP32", "data": [1]}), {},
     "shape of tensor 'INPUT0'"),
    ("bool in shape", _json_req({"name": "INPUT0", "shape": [True], "datatype": "FP32", "data": [1]}), {},
     "shape of tensor 'INPUT0'"),
    ("negative dim", _json_req({"name": "INPUT0", "shape": [-4], "datatype": "FP32", "data": [1]}), {},
     "negative dimension"),
    ("huge dims", _json_req({"name": "INPUT0", "shape": [2**62, 2**62], "datatype": "FP32", "data": [1]}), {},
     "tensor 'INPUT0'"),
    ("1e9 elements, 1 given", _json_req({"name": "INPUT0", "shape": [10**9], "datatype": "FP32",
                                         "data": [1.0]}), {}, "needs 1000000000, got 1"),
    ("unknown dtype", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP128", "data": [1]}), {},
     "invalid datatype 'FP128'"),
    ("wrong json type", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": ["a"]}), {},
     "expects JSON numbers"),
    ("bool as int", _json_req({"name": "INPUT0", "shape": [1], "datatype": "BOOL", "data": [1]}), {},
     "expects JSON booleans"),
    ("int out of range", _json_req({"name": "INPUT0", "shape": [1], "datatype": "INT8", "data": [300]}), {},
     "out of range"),
    ("fp16 json", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP16", "data": [1.0]}), {},
     "receiving FP16 data via JSON is not supported"),
    ("data and binary", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0],
                                   "parameters": {"binary_data_size": 4}}), {}, "exactly one of"),
    ("no data", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32"}), {}, "exactly one of"),
    ("binary without header", _json_req(fp32_input([1], 4)), {}, "Infer-Header-Content-Length"),
    ("reserved parameter", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                     parameters={"triton_x": 1}), {}, "reserved"),
    ("bad sequence id", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                  parameters={"sequence_id": -1}), {}, "sequence_id"),
    ("bad priority", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                               parameters={"priority": "high"}), {}, "priority"),
    ("object parameter", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                   parameters={"custom": {"a": 1}}), {}, "parameter 'custom' has invalid type"),
    ("unknown output", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                 outputs=[{"name": "NOPE"}]), {}, "NOPE"),
    ("10000 outputs", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
                                outputs=[{"name": f"O{i}"} for i in range(10000)]), {}, "outputs"),
    # (an output asked for twice is answered once, as Triton does: test_triton_parity.py)
    ("classification with shm", _json_req(
        {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]},
        outputs=[{"name": "OUTPUT0", "parameters": {"classification": 1, "shared_memory_region": "r",
                                                    "shared_memory_byte_size": 4}}]), {}, "classification"),
    ("long name", _json_req({"name": "I" * 300, "shape": [1], "datatype": "FP32", "data": [1]}), {},
     "exceeds the maximum"),
    ("unknown shm region", _json_req({"name": "INPUT0", "shape": [1], "datatype": "FP32", "parameters": {
        "shared_memory_region": "nope", "shared_memory_byte_size": 4}}), {}, "nope"),
    ("shm size mismatch", _json_req({"name": "INPUT0", "shape": [2], "datatype": "FP32", "parameters": {
        "shared_memory_region": "nope", "shared_memory_byte_size": 4}}), {}, "byte size mismatch"),
]


@pytest.mark.parametrize("name,body,headers,fragment", CASES, ids=[c[0] for c in CASES])
def test_malformed_json(served: Any, name: str, body: bytes, headers: dict[str, str], fragment: str) -> None:
    before = served.dp.infer_count
    status, message = post(served, IDENT, body, headers)
    assert status == 400, message
    assert fragment in message
    if "output" not in name:
        assert served.dp.infer_count == before  # refused before reaching the model
    check_alive(served)


def _binary_cases() -> list[tuple[str, bytes, dict[str, str], str]]:
    four = np.arange(4, dtype=np.float32).tobytes()
    cases = []
    body, h = binary_body({"inputs": [fp32_input([4], 16)]}, four[:10])
    cases.append(("truncated binary body", body, h, "expecting 16 additional bytes"))
    body, h = binary_body({"inputs": [fp32_input([4], 16)]}, four + b"xx")
    cases.append(("trailing bytes", body, h, "unexpected additional input data"))
    body, h = binary_body({"inputs": [fp32_input([4], 12)]}, four[:12])
    cases.append(("size vs shape", body, h, "byte size mismatch"))
    body, h = binary_body({"inputs": [fp32_input([10**9], 4)]}, four[:4])
    cases.append(("1e9 elements, 4 bytes", body, h, "Expected 4000000000, got 4"))
    body, h = binary_body({"inputs": [fp32_input([2**62, 2**62], 4)]}, four[:4])
    cases.append(("huge dims binary", body, h, "INPUT0"))
    body, h = binary_body({"inputs": [fp32_input([4], -16)]}, four)
    cases.append(("negative binary size", body, h, "binary_data_size"))
    for bad in ("-1", "abc", "99999", "1e3", "", "²"):
        body, _ = binary_body({"inputs": [fp32_input([4], 16)]}, four)
        cases.append((f"header length {bad!r}", body, {"Inference-Header-Content-Length": bad},
                      "Inference-Header-Content-Length"))
    body, h = binary_body({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": 8}}]},
                          b"\x02\x00\x00\x00ab\x00\x00")
    cases.append(("bytes framing short", body, h, "truncated length prefix"))
    body, h = binary_body({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": 8}}]},
                          b"\xff\x00\x00\x00abcd")
    cases.append(("bytes element overrun", body, h, "overruns"))
    body, h = binary_body({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": 8}}]},
                          b"\x00\x00\x00\x00\x00\x00\x00\x00")
    cases.append(("bytes too many elements", body, h, "additional data"))
    return cases


BINARY_CASES = _binary_cases()


@pytest.mark.parametrize("name,body,headers,fragment", BINARY_CASES, ids=[c[0] for c in BINARY_CASES])
def test_malformed_binary(served: Any, name: str, body: bytes, headers: dict[str, str], fragment: str) -> None:
    before = served.dp.infer_count
    status, message = post(served, IDENT, body, headers)
    assert status == 400, message
    assert fragment in message
    assert served.dp.infer_count == before
    check_alive(served)


def test_raw_binary_request(served: Any) -> None:
    data = np.arange(5, dtype=np.float32)
    status, headers, raw = request(served.port, "POST", IDENT, data.tobytes(),
                                   {"Inference-Header-Content-Length": "0"})
    assert status == 200
    hlen = int(headers["inference-header-content-length"])
    doc = json.loads(raw[:hlen])
    assert doc["outputs"][0]["shape"] == [5]
    assert np.array_equal(np.frombuffer(raw[hlen:], np.float32), data)
    status, _, raw = request(served.port, "POST", "/v2/models/identity_FP32/infer", b"abc",
                             {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "does not fit" in error_of(raw)
    status, _, raw = request(served.port, "POST", SIMPLE, b"\0" * 64, {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "exactly one input" in error_of(raw)
    # BYTES: the body is the one element (Triton 2.51 checked); the model input must be shape [1]
    status, headers, raw = request(served.port, "POST", "/v2/models/blob/infer", b"any bytes",
                                   {"Inference-Header-Content-Length": "0"})
    assert status == 200
    hlen = int(headers["inference-header-content-length"])
    assert raw[hlen:] == b"\x09\x00\x00\x00any bytes"
    status, _, raw = request(served.port, "POST", "/v2/models/identity_BYTES/infer", b"x",
                             {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "must have input shape [1]" in error_of(raw)


def test_unsupported_content_encoding(served: Any) -> None:
    status, message = post(served, IDENT, b"xx", {"Content-Encoding": "br"})
    assert status == 400 and "Content-Encoding" in message
    status, message = post(served, IDENT, b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400 and "decompress" in message
    status, message = post(served, IDENT, gzip.compress(b'{"inputs": [')[:-8], {"Content-Encoding": "gzip"})
    assert status == 400


def test_gzip_bomb_is_413(served: Any) -> None:
    bomb = gzip.compress(b"\0" * (64 * MAX_INPUT), compresslevel=9)  # 64 MiB inflated, ~64 KB sent
    assert len(bomb) < MAX_INPUT
    status, message = post(served, IDENT, bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "decompressed" in message
    status, message = post(served, IDENT, zlib.compress(b" " * (2 * MAX_INPUT)), {"Content-Encoding": "deflate"})
    assert status == 413
    check_alive(served)


def test_body_cap_json(served: Any) -> None:
    """cap - 128 bytes of JSON is served; cap + 128 is refused with 413 before the body is read."""
    for delta, expect in ((-128, 200), (128, 413)):
        size = MAX_INPUT + delta
        prefix = b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[1]}]}'
        body = prefix + b" " * (size - len(prefix))
        status, _, raw = request(served.port, "POST", IDENT, body)
        assert status == expect, raw[:200]
    check_alive(served)


def test_body_cap_binary_counts_the_tensors_not_the_json_header(served: Any) -> None:
    """As Triton applies --http-max-input-size: one tensor of exactly the cap plus its JSON header is
    served; 4 bytes more of tensor is refused with 413 before the body is read."""
    for extra, expect in ((0, 200), (4, 413)):
        n = (MAX_INPUT + extra) // 4
        head = json.dumps({"inputs": [fp32_input([n], n * 4)]}).encode()
        body = head + np.arange(n, dtype=np.float32).tobytes()
        headers = {"Inference-Header-Content-Length": str(len(head))}
        status, _, raw = request(served.port, "POST", IDENT, body, headers)
        assert status == expect, raw[:200]
    check_alive(served)
