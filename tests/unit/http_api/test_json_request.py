"""The one-pass JSON parser (http_api.json_request) gives what the general parser gives, or steps aside.

Every document below goes through `InferCodec.parse` (which tries the one-pass parser first) and through
the general parser alone; the requests, or the errors, must be the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from inferd.supervisor.http_api.codec import InferCodec
from inferd.supervisor.http_api.json_request import parse_plain
from inferd.worker.wire.errors import InferdError

from .fake_dataplane import FakeDataPlane
from .parsed_fields import parsed_fields as _fields

I16 = list(range(16))
F16 = [x + 0.25 for x in range(16)]


def _general(codec: InferCodec, body: bytes) -> Any:
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise AssertionError("only objects reach the parsers")
    return codec._parse_doc("m", "", doc, body, -1, len(body))


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", _fields(fn()))
    except InferdError as exc:
        return ("error", exc.code, exc.message)


def _inp(name: str = "INPUT0", datatype: str = "FP32", shape: Any = None, data: Any = None, **extra: Any) -> dict:
    item = {"name": name, "datatype": datatype, "shape": [16] if shape is None else shape,
            "data": I16 if data is None else data}
    item.update(extra)
    return item


PLAIN = [  # the one-pass parser takes these
    {"inputs": []},
    {"inputs": [_inp()]},
    {"inputs": [_inp("INPUT0"), _inp("INPUT1", data=F16)]},
    {"id": "r7", "inputs": [_inp(shape=[1, 16])]},
    {"inputs": [_inp(shape=[2, 8])], "outputs": [{"name": "OUTPUT0"}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                     {"name": "OUTPUT1", "parameters": {"binary_data": False}}]},
    {"inputs": [_inp(data=[-(1 << 53)] + I16[1:])]},  # ints still exact as floats
    {"inputs": [_inp(data=[1 << 53] + F16[1:])]},  # ints and floats for a float type
    {"inputs": [_inp(datatype="FP64", data=[3] + F16[1:])]},
] + [{"inputs": [_inp(datatype=dt)]} for dt in ("FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
                                                 "UINT32", "UINT64")]

OTHER = [  # the general parser reads these (some fail, with its messages)
    {"inputs": [_inp(parameters={"x": 1})]},
    {"inputs": [_inp(data=[I16[:8], I16[8:]], shape=[2, 8])]},  # nested data
    {"inputs": [_inp(datatype="BOOL", data=[True] * 16)]},
    {"inputs": [_inp(datatype="BYTES", data=["a"] * 16)]},
    {"inputs": [_inp(datatype="FP16")]},
    {"inputs": [_inp(data=[True] * 16)]},
    {"inputs": [_inp(data=[1 << 60] * 16)]},  # beyond exact floats: numpy's conversion
    {"inputs": [_inp(data=[(1 << 53) + 1] + F16[1:])]},  # ... among floats too
    {"inputs": [_inp(data=[True] + F16[1:])]},
    {"inputs": [_inp(datatype="INT64", data=[1] * 15 + [1.0])]},
    {"inputs": [{"nam": "INPUT0", "datatype": "FP32", "shape": [16], "data": I16}]},  # four keys, one wrong
    {"inputs": [_inp("INPUT0"), _inp("INPUT1"), _inp("INPUT0")]},  # twice, not in a row
    {"inputs": [_inp(datatype="INT8", data=[300] * 16)]},  # out of range
    {"inputs": [_inp(datatype="UINT8", data=[-1] * 16)]},
    {"inputs": [_inp(datatype="INT32", data=F16)]},  # floats for an integer type
    {"inputs": [_inp(data=["x"] * 16)]},
    {"inputs": [_inp(data=[None] * 16)]},
    {"inputs": [_inp(data=I16[:15])]},  # too few elements
    {"inputs": [_inp(data=[])]},
    {"inputs": [_inp(shape=[0], data=[])]},
    {"inputs": [_inp(shape=[-1])]},
    {"inputs": [_inp(shape=[16.0])]},
    {"inputs": [_inp(shape=[True, 16])]},
    {"inputs": [_inp(shape="16")]},
    {"inputs": [_inp(shape=[1] * 65 + [16])]},
    {"inputs": [_inp(shape=[1 << 62, 1 << 3])]},
    {"inputs": [_inp(datatype="NOPE")]},
    {"inputs": [_inp(datatype=5)]},
    {"inputs": [_inp(name="")]},
    {"inputs": [_inp(name=7)]},
    {"inputs": [_inp(name="x" * 300)]},
    {"inputs": [_inp(), _inp()]},  # twice
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16]}]},  # no data
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": I16, "extra": 1}]},  # no shape
    {"inputs": [[1, 2]]},
    {"inputs": {"name": "INPUT0"}},
    {"inputs": [_inp()] * 300},
    {"id": 5, "inputs": [_inp()]},
    {"parameters": {"priority": 2}, "inputs": [_inp()]},
    {"model_name": "m", "inputs": [_inp()]},
    {"inputs": [_inp()], "outputs": {"name": "OUTPUT0"}},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]},
    {"inputs": [_inp()], "outputs": [{"name": ""}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True, "x": 1}}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r",
                                                                         "shared_memory_byte_size": 64}}]},
    {"inputs": [_inp()], "outputs": [{"name": "OUTPUT0", "x": 1}]},
    {"inputs": [_inp()], "outputs": [{"x": 1}]},
    {"inputs": [_inp()], "outputs": ["OUTPUT0"]},
    {},
]


@pytest.mark.parametrize("doc", PLAIN, ids=lambda d: json.dumps(d)[:60])
def test_simple_documents_take_the_one_pass_parser_and_match(doc: dict[str, Any]) -> None:
    codec = InferCodec(FakeDataPlane())
    body = json.dumps(doc).encode()
    assert parse_plain("m", "", json.loads(body), codec.limits) is not None
    assert _outcome(lambda: codec.parse("m", "", {}, body)) == _outcome(lambda: _general(codec, body))


@pytest.mark.parametrize("doc", OTHER, ids=lambda d: json.dumps(d)[:60])
def test_other_documents_get_the_general_parsers_answer(doc: dict[str, Any]) -> None:
    codec = InferCodec(FakeDataPlane())
    body = json.dumps(doc).encode()
    assert parse_plain("m", "", json.loads(body), codec.limits) is None
    assert _outcome(lambda: codec.parse("m", "", {}, body)) == _outcome(lambda: _general(codec, body))


def test_the_one_pass_parser_takes_the_benchmark_request() -> None:
    """bench/run.py's add_sub body (ints for FP32) is the simple form: the served benchmark uses this path."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": I16},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": [16], "data": [1] * 16}]},
                      separators=(",", ":")).encode()
    codec = InferCodec(FakeDataPlane())
    assert parse_plain("m", "", json.loads(body), codec.limits) is not None


@pytest.mark.parametrize("body", [b"{}", b'{"model_name":"m","outputs":[]}', b"x" * 65536, "é".encode()])
def test_the_templated_answer_is_the_general_answer(body: bytes) -> None:
    from inferd.supervisor.http_api.request_cycle import Response, json_ok, response_head

    assert json_ok(body) == b"".join([*response_head(Response(200, body), len(body), True, None), body])


def test_served_answers_are_the_same_bytes_with_and_without_the_one_pass_parser(served: Any,
                                                                               monkeypatch: Any) -> None:
    """Over a real connection: every document above, to two models, answered with the same status, headers
    and body whether the one-pass parser runs or the general parser reads everything."""
    from inferd.supervisor.http_api import codec as codec_module

    from .rawhttp import RawConn, build

    requests = [build("POST", f"/v2/models/{model}/infer", json.dumps(doc).encode(),
                      {"Content-Type": "application/json"})
                for model in ("identity_FP32", "simple") for doc in PLAIN + OTHER]

    def answers() -> list[tuple[int, dict[str, str], bytes]]:
        conn = RawConn(served.port)
        try:
            out = []
            for raw in requests:
                conn.send(raw)
                out.append(conn.read_response())
            return out
        finally:
            conn.close()

    fast = answers()
    monkeypatch.setattr(codec_module, "parse_plain", lambda *args: None)
    general = answers()
    assert [status for status, _, _ in fast].count(200) >= 5  # some of them do run
    assert fast == general
