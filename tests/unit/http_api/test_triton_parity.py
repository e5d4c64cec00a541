"""Where the differential test against Triton 2.51 (tests/e2e/test_differential_triton.py) found inferd's
HTTP frontend answering otherwise; each case is what Triton 2.51 answered here.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import pytest

from .rawhttp import error_of, request
from .test_malformed import binary_body, check_alive

IDENT = "/v2/models/identity_FP32/infer"
IDENT64 = "/v2/models/identity_FP64/infer"


def infer(served: Any, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    status, _, raw = request(served.port, "POST", path, body, headers)
    return status, raw


# ---------------------------------------------------------------- NaN and infinities in JSON

@pytest.mark.parametrize("path,datatype,fmt", [(IDENT, "FP32", "<4f"), (IDENT64, "FP64", "<4d")])
def test_json_nan_infinity_round_trip(served: Any, path: str, datatype: str, fmt: str) -> None:
    """tritonclient sends NaN/Infinity/-Infinity for such inputs; Triton reads them and writes them back
    (inferd answered 400, and wrote null for non-finite outputs: an infinity came back as NaN)."""
    body = ('{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"%s","data":[NaN,Infinity,-Infinity,1.5]}]}'
            % datatype).encode()
    status, raw = infer(served, path, body)
    assert status == 200, raw
    assert b'"data":[NaN,Infinity,-Infinity,1.5]' in raw
    out = json.loads(raw)["outputs"][0]
    assert out["shape"] == [4] and out["datatype"] == datatype
    # the same values sent binary, asked back as JSON
    blob = struct.pack(fmt, float("inf"), float("-inf"), float("nan"), -0.0)
    hdr = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": datatype,
                       "parameters": {"binary_data_size": len(blob)}}],
           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    body, headers = binary_body(hdr, blob)
    status, raw = infer(served, path, body, headers)
    assert status == 200, raw
    assert b'"data":[Infinity,-Infinity,NaN,-0.0]' in raw
    assert b"null" not in raw


def test_nan_after_non_ascii_text(served: Any) -> None:
    """orjson reports where it stopped in characters, not bytes: a literal after UTF-8 text is found too."""
    body = ('{"id":"h\u00e9llo \u2603\U0001F600","inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32",'
            '"data":[-Infinity,NaN]}]}').encode("utf-8")
    status, raw = infer(served, IDENT, body)
    assert status == 200, raw
    doc = json.loads(raw)
    assert doc["id"] == "h\u00e9llo \u2603\U0001F600" and b'"data":[-Infinity,NaN]' in raw


def test_finite_json_outputs_are_unchanged(served: Any) -> None:
    body = b'{"inputs":[{"name":"INPUT0","shape":[3],"datatype":"FP32","data":[1e38,-1e38,0.5]}]}'
    status, raw = infer(served, IDENT, body)
    assert status == 200
    assert json.loads(raw)["outputs"][0]["data"] == [struct.unpack("<f", struct.pack("<f", v))[0]
                                                     for v in (1e38, -1e38, 0.5)]


@pytest.mark.parametrize("name,body,fragment", [
    # a syntax error other than the literals is still one, wherever the literal is
    ("trailing comma after NaN", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[NaN,]}]}',
     "failed to parse the request JSON"),
    # numbers beyond a double, integers beyond 64 bits, lone surrogates: refused as orjson refuses them
    ("1e400 after NaN", b'{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[NaN,1e400]}]}',
     "infinity when parsed as double"),
    ("1e400 as an integer after NaN", b'{"id":"","parameters":{"p":1' + b"0" * 400 + b'},'
     b'"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[NaN]}]}', "infinity when parsed as double"),
    ("lone surrogate after NaN", b'{"id":"\\ud800","inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32",'
     b'"data":[NaN]}]}', "failed to parse the request JSON"),
    # NaN where an integer is wanted (Triton answers 500 here)
    ("NaN for INT32", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[NaN]}]}',
     "expects JSON integers"),
    # rapidjson's other spellings (Inf, -NaN) are not read: no client writes them
    ("Inf", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[Inf]}]}',
     "failed to parse the request JSON"),
    ("nan", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[nan]}]}',
     "failed to parse the request JSON"),
])
def test_nonfinite_fallback_refuses_what_orjson_refuses(served: Any, name: str, body: bytes, fragment: str) -> None:
    path = "/v2/models/identity_INT32/infer" if b"INT32" in body else IDENT
    status, raw = infer(served, path, body)
    assert status == 400, raw
    assert fragment in error_of(raw), error_of(raw)
    check_alive(served)


@pytest.mark.parametrize("big", [2**64, -(2**63) - 1, 10**30])
def test_integers_beyond_64_bits_read_as_orjson_reads_them(served: Any, big: int) -> None:
    """orjson reads them as doubles; the NaN path must too (it refused them: found by fuzz/targets/json_request)."""
    seen = []
    for data in (b"[1.5]", b"[NaN]"):
        body = (b'{"parameters":{"p":%d},"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":%s}]}'
                % (big, data))
        status, raw = infer(served, IDENT, body)
        assert status == 200, (data, raw)
        seen.append(served.dp.last_request.parameters["p"])
    assert seen == [float(big), float(big)]


def test_nan_in_a_binary_request_header(served: Any) -> None:
    """The binary extension's JSON header is read the same way."""
    hdr = {"parameters": {"x": 1}, "inputs": [
        {"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [float("nan"), float("inf")]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    body, headers = binary_body(hdr)
    status, raw = infer(served, IDENT, body, headers)
    assert status == 200, raw
    hlen = len(raw) - 8
    assert raw[hlen:] == struct.pack("<2f", float("nan"), float("inf"))


# ---------------------------------------------------------------- requested outputs

@pytest.mark.parametrize("first,second", [(True, False), (False, True), (None, True)])
def test_an_output_asked_for_twice_is_answered_once_as_first_asked(served: Any, first: Any, second: Any) -> None:
    """Triton 2.51 keeps the first request of an output (inferd answered 400)."""
    def out(binary: Any) -> dict[str, Any]:
        return {"name": "OUTPUT0", **({"parameters": {"binary_data": binary}} if binary is not None else {})}

    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2.5]}],
                       "outputs": [out(first), out(second)]}).encode()
    status, headers, raw = request(served.port, "POST", IDENT, body)
    assert status == 200, raw
    if first:
        hlen = int(headers["inference-header-content-length"])
        doc = json.loads(raw[:hlen])
        assert raw[hlen:] == struct.pack("<f", 2.5)
        assert doc["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1],
                                   "parameters": {"binary_data_size": 4}}]
    else:
        assert "inference-header-content-length" not in headers
        assert json.loads(raw)["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [2.5]}]


def test_a_repeated_output_still_has_its_parameters_checked(served: Any) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}],
                       "outputs": [{"name": "OUTPUT0"},
                                   {"name": "OUTPUT0", "parameters": {"binary_data": 1}}]}).encode()
    status, raw = infer(served, IDENT, body)
    assert status == 400 and "'binary_data' of output 'OUTPUT0' must be a boolean" in error_of(raw)


@pytest.mark.parametrize("binary,status", [(True, 400), (False, 200)])
def test_binary_data_true_with_a_shared_memory_output_is_refused(served: Any, tmp_path: Any, binary: bool,
                                                                  status: int) -> None:
    """Triton 2.51: "Output can't set both 'shared_memory_region' and 'binary_data'" for binary_data true;
    false is accepted (inferd accepted both)."""
    key = f"/paritytest_{os.getpid()}_{binary}"
    with open(f"/dev/shm{key}", "wb") as f:
        f.truncate(64)
    try:
        reg = json.dumps({"key": key, "offset": 0, "byte_size": 64}).encode()
        assert request(served.port, "POST", "/v2/systemsharedmemory/region/par/register", reg)[0] == 200
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {
                               "binary_data": binary, "shared_memory_region": "par",
                               "shared_memory_byte_size": 4}}]}).encode()
        got, raw = infer(served, IDENT, body)
        assert got == status, raw
        if status == 400:
            assert "Output can't set both 'shared_memory_region' and 'binary_data'" in error_of(raw)
    finally:
        request(served.port, "POST", "/v2/systemsharedmemory/region/par/unregister", b"")
        os.unlink(f"/dev/shm{key}")


@pytest.mark.parametrize("shape,binary", [([0], True), ([2], True), ([0], False)])
def test_only_bytes_after_the_json_make_an_answer_binary(served: Any, shape: list[int], binary: bool) -> None:
    """An empty output asked for as binary is listed with binary_data_size 0, but with no bytes to follow
    Triton answers plain JSON (no Inference-Header-Content-Length); inferd sent the header."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0] * shape[0]}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary}}]}).encode()
    status, headers, raw = request(served.port, "POST", IDENT, body)
    assert status == 200, raw
    has_bytes = binary and shape[0] > 0
    assert ("inference-header-content-length" in headers) == has_bytes
    assert headers["content-type"] == ("application/octet-stream" if has_bytes else "application/json")
    if binary and not has_bytes:
        assert json.loads(raw)["outputs"][0]["parameters"] == {"binary_data_size": 0}
