"""The Execute writer (wire.codec.execute_header, fed by instances/packing.py) and the supervisor's
decoding of results (instances/results.decode) stay equivalent to the generic wire codec."""

from __future__ import annotations

import json

import pytest
from inferd.supervisor.inference.types import InferRequest, RequestedOutput, Tensor
from inferd.supervisor.instances import results
from inferd.supervisor.instances.packing import request_item
from inferd.supervisor.tracing.record import Trace
from inferd.worker.wire import messages as m


def Frame(data: bytes) -> memoryview:  # noqa: N802 - frames arrive from the channel as memoryviews
    return memoryview(data)


def test_execute_header_matches_wire_encoding():
    req = InferRequest("m", id="abc", outputs=[RequestedOutput("OUT")], parameters={"p": 1},
                       correlation_id="seq-1", flags=3, timeout_us=5, device_outputs=True)
    req.trace = Trace(42, "m", "1", "abc", None, False, lambda t: None)  # a traced request names its trace
    refs = [m.tensor_ref("IN", "FP32", (2,), "frame", 0, "", 0, 8),
            m.tensor_ref("BIG", "INT8", [1 << 20], "cuda", -1, "ab" * 64, 0, 1 << 20, 1, "p_0")]
    fast = m.execute_header(7, [request_item(11, req, refs)], ["inferd_1_9"])
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
    ref = m.tensor_ref("X", "FP32", [1], "frame", 0, "", 4, 4)
    for cid in (0, "", "s", 7):
        plain.correlation_id = cid
        fast = m.execute_header(1, [request_item(1, plain, [ref])], [])
        item = json.loads(fast)["requests"][0]
        assert set(item) == {"request_id", "id", "inputs", "requested_outputs"} | (
            set() if cid == 0 and type(cid) is int else {"correlation_id"})
        assert set(item["inputs"][0]) == {"name", "datatype", "shape", "frame", "offset", "nbytes"}
        typed = m.Execute(1, [m.RequestItem(1, "", [m.TensorRef("X", "FP32", [1], "frame", 0, "", 4, 4)], [],
                                            "{}", cid, 0, 0)], [])
        decoded, _ = m.decode([Frame(fast)])
        assert decoded == typed and repr(decoded) == repr(typed)
        assert type(decoded.requests[0].correlation_id) is type(cid)


def test_decode_execute_result_and_others():
    res = m.ExecuteResult(3, [m.ResponseItem(5, [m.TensorRef("O", "FP32", [1], "frame", 0)],
                                             None, {"k": "v"}),
                              m.ResponseItem(6, [], m.WireError(3, "bad"))], 1, 2, 3)
    frames = [Frame(f if isinstance(f, bytes) else bytes(f)) for f in m.encode(res, [b"abcd"])]
    header, data = results.decode(frames)
    assert header == res and len(data) == 1
    assert header.responses[1].error == m.WireError(3, "bad")
    msg, _ = results.decode([Frame(m.encode(m.Hello(1, 2, "x", "3.11", "2", "4"))[0])])
    assert isinstance(msg, m.Hello)
    with pytest.raises(m.ProtocolError):
        results.decode([Frame(b"{nope")])
    with pytest.raises(m.ProtocolError):
        results.decode([Frame(b'{"t":"what"}')])
    with pytest.raises(m.ProtocolError):
        results.decode([])


@pytest.mark.parametrize("body", [
    '{"batch_id":1,"responses":[{"request_id":1,"outputs":[],"extra":1}],"t":"execute_result"}',
    '{"batch_id":1,"responses":[{"outputs":[]}],"t":"execute_result"}',
    '{"batch_id":1,"responses":[{"request_id":1,"outputs":[{"name":"x","bogus":1}]}],"t":"execute_result"}',
    '{"batch_id":1,"responses":[{"request_id":1,"outputs":{}}],"t":"execute_result"}',
    '{"batch_id":1,"responses":[{"request_id":1,"error":{"code":1}}],"t":"execute_result"}',
    '{"batch_id":1,"responses":{},"t":"execute_result"}',
    # the first response already built when the second turns out bad: the generic decoder starts afresh
    '{"batch_id":1,"responses":[{"request_id":1,"outputs":[{"name":"x","datatype":"FP32","shape":[1]}],'
    '"error":{"code":1,"message":"m"}},{"request_id":2,"outputs":[{"name":"y"}]}],"t":"execute_result"}',
    '{"responses":[],"t":"execute_result"}',
    '{"batch_id":1,"request_ids":[1],"outputs":[{"name":"x","datatype":"FP32","shape":[]}],'
    '"t":"execute_result_columns"}',
    '{"batch_id":1,"request_ids":[1],"t":"execute_result_columns"}',
])
def test_malformed_results_are_protocol_errors_as_in_the_generic_decoder(body):
    """The fast result decoders leave anything unusual to the generic one, which refuses it."""
    with pytest.raises(m.ProtocolError) as fast:
        results.decode([Frame(body.encode())])
    with pytest.raises(m.ProtocolError) as generic:
        m.decode([body.encode()])
    assert str(fast.value) == str(generic.value)
    with pytest.raises(m.ProtocolError) as read:  # the worker process's reader: the same refusal
        results.read([Frame(body.encode())])
    assert str(read.value) == str(generic.value)


def test_results_with_defaults_left_out_or_given_decode_alike():
    full = m.ExecuteResult(4, [m.ResponseItem(9, [m.TensorRef("O", "FP32", [1], "frame", 0, "", 0, 4)],
                                              None, {}), m.ResponseItem(10, [], m.WireError(13, "x"), {"a": 1})])
    compact = m.execute_result_header(4, [
        m.response_item_json(9, [m.output_ref_json("O", "FP32", (1,), 0, 0, 4)]),
        m.response_item_json(10, [], m.WireError(13, "x"), {"a": 1})])
    for raw in (m.encode_header(full), compact, compact.replace(b',"outputs":[]', b"")):
        message, _ = results.decode([Frame(raw)])
        assert message == full and repr(message) == repr(full)


@pytest.mark.parametrize("ref,error", [
    ('{"name":"O","datatype":"FP32","shape":[1],"frame":1,"offset":0,"nbytes":4}', "bad reference"),
    ('{"name":"O","datatype":"FP32","shape":[1],"frame":0,"offset":6,"nbytes":4}', "outside its data frame"),
    ('{"name":"O","datatype":"FP32","shape":[1],"frame":0,"offset":-1,"nbytes":4}', "outside its data frame"),
    ('{"name":"O","datatype":"FP32","shape":[1],"frame":true,"offset":0,"nbytes":4}', "bad reference"),
    ('{"name":"O","datatype":"FP32","shape":[1],"loc":"disk","frame":0}', "bad reference"),
    ('{"name":"O","datatype":"FP32","shape":[1],"loc":"shm","region":"r","nbytes":4}', "bad reference"),
])
def test_results_with_bad_output_references_are_refused(ref, error):
    header = m.execute_result_header(1, [m.response_item_json(7, [ref])])
    for reader in (results.decode, results.read):  # (read gives the plain ones as PlainResults)
        msg, data = reader([Frame(header), Frame(b"12345678")])
        with pytest.raises(ValueError, match=error):
            results.batch_result([InferRequest("m")], [7], msg, data, "1")


def test_result_outputs_are_views_of_their_frames():
    refs = [m.output_ref_json("A", "FP32", [1], 0, 0, 4), m.output_ref_json("B", "FP32", [1], 0, 4, 4),
            m.output_ref_json("C", "UINT8", [0], 1, 0, 0)]
    msg, data = results.decode([Frame(m.execute_result_header(1, [m.response_item_json(7, refs, None, {"k": 1})])),
                                Frame(b"12345678"), Frame(b"")])
    (response,) = results.batch_result([InferRequest("m", id="x")], [7], msg, data, "2").responses
    assert [(t.name, list(t.shape), bytes(t.data)) for t in response.outputs] == [
        ("A", [1], b"1234"), ("B", [1], b"5678"), ("C", [0], b"")]
    assert (response.id, response.model_version, response.parameters) == ("x", "2", {"k": 1})


def _plain_frames() -> list[memoryview]:
    """A plain ExecuteResult as the worker writes it: two requests, outputs sharing a frame, an empty one."""
    first = [m.output_ref_json("A", "FP32", (1,), 0, 0, 4), m.output_ref_json("B", "FP32", [1], 0, 4, 4),
             m.output_ref_json("C", "UINT8", (0,), 1, 0, 0)]
    second = [m.output_ref_json("A", "INT16", (2,), 0, 0, 8)]
    header = m.execute_result_header(9, [m.response_item_json(7, first), m.response_item_json(8, second)], 1, 2, 3)
    return [Frame(header), Frame(b"12345678"), Frame(b"")]


def test_plain_results_are_read_in_one_pass_into_the_same_responses():
    frames = _plain_frames()
    msg, data = results.read(frames)
    assert type(msg) is results.PlainResult and msg.batch_id == 9
    generic, generic_data = results.decode(frames)
    assert type(generic) is m.ExecuteResult
    requests = [InferRequest("m", id="x"), InferRequest("m", "4", id="y")]
    fast = results.batch_result(requests, [7, 8], msg, data, "")
    slow = results.batch_result(requests, [7, 8], generic, generic_data, "")
    assert fast == slow
    assert (fast.compute_input_ns, fast.compute_infer_ns, fast.compute_output_ns) == (1, 2, 3)
    assert [[(t.name, t.datatype, list(t.shape), bytes(t.data)) for t in r.outputs] for r in fast.responses] == [
        [("A", "FP32", [1], b"1234"), ("B", "FP32", [1], b"5678"), ("C", "UINT8", [0], b"")],
        [("A", "INT16", [2], b"12345678")]]
    assert [(r.id, r.model_version, r.parameters) for r in fast.responses] == [("x", "", {}), ("y", "4", {})]


@pytest.mark.parametrize("ids,error", [([7], "2 responses for 1 requests"), ([8, 7], "responses out of order")])
def test_plain_results_out_of_step_are_refused_alike(ids, error):
    requests = [InferRequest("m") for _ in ids]
    for reader in (results.decode, results.read):
        msg, data = reader(_plain_frames())
        with pytest.raises(ValueError, match=error):
            results.batch_result(requests, ids, msg, data, "1")


@pytest.mark.parametrize("raw", [
    m.execute_result_header(4, [m.response_item_json(9, [m.output_ref_json("O", "FP32", (1,), 0, 0, 4)], None,
                                                     {"k": 1})]),  # parameters: not plain
    m.execute_result_header(4, [m.response_item_json(9, [], m.WireError(13, "x"))]),  # an error
    m.execute_result_header(4, [m.response_item_json(9, [m.output_shm_ref_json("O", "FP32", [1], "r", 4)])]),
    m.encode_header(m.ExecuteResult(4, [m.ResponseItem(9, [m.TensorRef("O", "FP32", [1], "frame", 0, "", 0, 4)])])),
    m.execute_result_header(4, [m.response_item_json(9, [m.output_ref_json("O", "FP32", (1,), 0, 0, 4)])])[:-1]
    + b',"extra":1}',  # a field the plain shape does not have: the generic decoder judges it
    m.execute_result_columns_header(4, [9], [("O", "FP32", (1,))]),
    m.encode(m.Hello(1, 2, "x", "3.11", "2", "4"))[0],
])
def test_other_messages_are_read_as_decode_reads_them(raw):
    frames = [Frame(bytes(raw)), Frame(b"1234")]
    try:
        expected: object = results.decode(frames)[0]
    except m.ProtocolError as exc:
        with pytest.raises(m.ProtocolError) as read:
            results.read(frames)
        assert str(read.value) == str(exc)
        return
    message, data = results.read(frames)
    assert type(message) is type(expected) and message == expected and list(data) == [b"1234"]


def test_poll_us_reaches_the_worker_in_both_execute_forms():
    """An Execute's `poll_us` (the worker polls for its next message once it has answered) is read alike by
    the fast decoders and the generic one; left out of an ExecuteColumns it is 0; one that is not a number
    is left to the generic decoder, which keeps it as it is (the worker's runtime refuses it)."""
    item = request_item(1, InferRequest("m"), [m.tensor_ref("IN", "FP32", (2,), "frame", 0, "", 0, 8)])
    for poll_us in (0, 250):
        fast, _ = m.decode([Frame(m.execute_header(3, [item], [], poll_us))])
        assert fast.poll_us == poll_us
        assert fast == m.decode([Frame(m.encode(fast)[0])])[0]
        header = m.execute_columns_header(4, [1, 2], [("IN", "FP32", [1, 2])], ["", ""], [], [], poll_us)
        assert ("poll_us" in json.loads(header)) == bool(poll_us)
        columns, _ = m.decode([Frame(header)])
        assert columns.poll_us == poll_us and columns.ids == [] and columns.forget_regions == []
        assert columns == m.decode([Frame(m.encode(columns)[0])])[0]
    bad = json.loads(m.execute_header(3, [item], [], 5))
    bad["poll_us"] = "soon"
    assert m.decode([Frame(json.dumps(bad).encode())])[0].poll_us == "soon"
