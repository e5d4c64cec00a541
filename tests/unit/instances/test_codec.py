"""The hot-path Execute/ExecuteResult framing stays equivalent to wire.messages."""

from __future__ import annotations

import json

import pytest
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor
from inferd.supervisor.instances import codec
from inferd.supervisor.tracing.record import Trace
from inferd.worker.wire import messages as m


def Frame(data: bytes) -> memoryview:  # noqa: N802 - frames arrive from the channel as memoryviews
    return memoryview(data)


def test_execute_header_matches_wire_encoding():
    req = InferRequest("m", id="abc", outputs=[RequestedOutput("OUT")], parameters={"p": 1},
                       correlation_id="seq-1", flags=3, timeout_us=5, device_outputs=True)
    req.trace = Trace(42, "m", "1", "abc", None, False, lambda t: None)  # a traced request names its trace
    refs = [codec.tensor_ref("IN", "FP32", (2,), "frame", 0, "", 0, 8),
            codec.tensor_ref("BIG", "INT8", [1 << 20], "cuda", -1, "ab" * 64, 0, 1 << 20, 1, "p_0")]
    fast = codec.execute_header(7, [codec.request_item(11, req, refs)], ["inferd_1_9"])
    typed = m.Execute(7, [m.RequestItem(
        11, "abc",
        [m.TensorRef("IN", "FP32", [2], "frame", 0, "", 0, 8),
         m.TensorRef("BIG", "INT8", [1 << 20], "cuda", -1, "ab" * 64, 0, 1 << 20, 1, "p_0")],
        ["OUT"], json.dumps({"p": 1}), "seq-1", 3, 5, True, "42")], ["inferd_1_9"])
    generic = json.loads(m.encode(typed)[0])
    for key in ("loc", "region", "device", "owner"):  # a frame reference leaves its defaults out
        del generic["requests"][0]["inputs"][0][key]
    assert json.loads(fast) == generic
    decoded, _ = m.decode([Frame(fast)])
    assert decoded == typed
    assert set(json.loads(fast)) - {"t"} == {f for f in m.Execute.__dataclass_fields__}
    item_fields = set(json.loads(fast)["requests"][0])
    assert item_fields == set(m.RequestItem.__dataclass_fields__)
    assert set(json.loads(fast)["requests"][0]["inputs"][1]) == set(m.TensorRef.__dataclass_fields__)


def test_execute_header_leaves_defaults_out_and_decodes_the_same():
    plain = InferRequest("m", inputs=[Tensor("X", "FP32", [1], b"1234")])
    ref = codec.tensor_ref("X", "FP32", [1], "frame", 0, "", 4, 4)
    for cid in (0, "", "s", 7):
        plain.correlation_id = cid
        fast = codec.execute_header(1, [codec.request_item(1, plain, [ref])], [])
        item = json.loads(fast)["requests"][0]
        assert set(item) == {"request_id", "id", "inputs", "requested_outputs"} | (
            set() if cid == 0 and type(cid) is int else {"correlation_id"})
        assert set(item["inputs"][0]) == {"name", "datatype", "shape", "frame", "offset", "nbytes"}
        typed = m.Execute(1, [m.RequestItem(1, "", [m.TensorRef("X", "FP32", [1], "frame", 0, "", 4, 4)], [],
                                            "{}", cid, 0, 0)], [])
        decoded, _ = m.decode([Frame(fast)])
        assert decoded == typed and repr(decoded) == repr(typed)
        assert type(decoded.requests[0].correlation_id) is type(cid)


def test_parse_execute_result_and_others():
    res = m.ExecuteResult(3, [m.ResponseItem(5, [m.TensorRef("O", "FP32", [1], "frame", 0)],
                                             None, {"k": "v"}),
                              m.ResponseItem(6, [], m.WireError(3, "bad"))], 1, 2, 3)
    frames = [Frame(f if isinstance(f, bytes) else bytes(f)) for f in m.encode(res, [b"abcd"])]
    header, data = codec.parse(frames)
    assert header["t"] == "execute_result" and header["batch_id"] == 3 and len(data) == 1
    assert header["responses"][1]["error"] == {"code": 3, "message": "bad"}
    msg, _ = codec.parse([Frame(m.encode(m.Hello(1, 2, "x", "3.11", "2", "4"))[0])])
    assert isinstance(msg, m.Hello)
    with pytest.raises(m.ProtocolError):
        codec.parse([Frame(b"{nope")])
    with pytest.raises(m.ProtocolError):
        codec.parse([Frame(b'{"t":"what"}')])
    with pytest.raises(m.ProtocolError):
        codec.parse([])
