"""The worker's per-request fast paths give exactly what the generic code gives.

- `wire.messages`: an ExecuteResult header written directly equals `_plain` + json.dumps; an Execute
  built from the parsed JSON equals `_build`'s; `_loads` equals json.loads (values and errors).
- `wire.dtypes.from_numpy` (cached) equals the uncached lookup.
- `Channel.send`: small frames copied, big ones zero-copy, a non-buffer frame refused before
  anything is queued.
"""

from __future__ import annotations

import json
import time

import numpy as np
import orjson
import pytest
import zmq
from inferd.worker.channel import Channel, header_loads
from inferd.worker.wire import codec as wire_codec
from inferd.worker.wire import dtypes
from inferd.worker.wire import messages as m


def generic_header(message: object) -> bytes:
    header = wire_codec._plain(message)
    header["t"] = m.TAGS[type(message)]
    return json.dumps(header, separators=(",", ":")).encode()


def ref(name: str = "OUT", frame: int = 0, **kw: object) -> m.TensorRef:
    fields: dict = dict(name=name, datatype="FP32", shape=[2, 3], loc="frame", frame=frame, nbytes=24)
    fields.update(kw)
    return m.TensorRef(**fields)


RESULTS = [
    m.ExecuteResult(1, []),
    m.ExecuteResult(7, [m.ResponseItem(3, [ref("A", 0), ref("B", 1, shape=[])])], 10, 20, 30),
    m.ExecuteResult(2, [
        m.ResponseItem(5, [], m.WireError(3, 'bad "input" \u00e9\n\u2603')),
        m.ResponseItem(6, [ref("na\u00efve \"x\"", 0, datatype="BYTES", shape=(4,), nbytes=99)], None,
                       {"k": "v", "n": 1, "f": 1.5, "b": True, "none": None, "nested": {"l": [1, "2"]}}),
        m.ResponseItem(1 << 70, [ref(region="r", loc="shm", frame=-1, offset=5)]),
    ], 1 << 40, 0, -1),
    # unusual types: the generic path answers (and must give the same text)
    m.ExecuteResult(True, []),  # type: ignore[arg-type]
    m.ExecuteResult("b", [m.ResponseItem("r", [])]),  # type: ignore[arg-type]
    m.ExecuteResult(1, [m.ResponseItem(1, [ref(shape=[np.int64(2)])])]),
    m.ExecuteResult(1, [m.ResponseItem(1, [ref(shape=[2.0])])]),
    m.ExecuteResult(1, [m.ResponseItem(1, [ref(frame=False)])]),
    m.ExecuteResult(1, [m.ResponseItem(1, [], m.WireError(True, "x"))]),  # type: ignore[arg-type]
    m.ExecuteResult(1, [m.ResponseItem(1, [], None, {"t": (1, 2)})]),
]


@pytest.mark.parametrize("result", RESULTS)
def test_execute_result_header_equals_generic(result):
    try:
        expected = generic_header(result)
    except TypeError as exc:  # e.g. a numpy integer: not JSON
        with pytest.raises(TypeError) as got:
            m.encode_header(result)
        assert str(got.value) == str(exc)
        return
    assert m.encode_header(result) == expected
    assert m.encode(result, [b"x"]) == [expected, b"x"]


def test_execute_result_unencodable_parameters_raise_like_generic():
    bad = m.ExecuteResult(1, [m.ResponseItem(1, [], None, {"x": object()})])
    with pytest.raises(TypeError):
        generic_header(bad)
    with pytest.raises(TypeError):
        m.encode_header(bad)


def test_other_messages_unchanged():
    for message in (m.Hello(1, 2, "w", "3.9.18", "1.26", "25"), m.LoadResult(m.WireError(1, "x")), m.Bye(),
                    m.Heartbeat(3), m.AutoCompleteResult("{}")):
        assert m.encode_header(message) == generic_header(message)


def execute_json(**over: object) -> dict:
    item = {"request_id": 1, "id": "a", "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [2], "loc": "frame", "frame": 0, "region": "",
         "offset": 0, "nbytes": 8}], "requested_outputs": ["Y"], "parameters": "{}", "correlation_id": "s",
        "flags": 1, "timeout_us": 5}
    doc = {"batch_id": 4, "requests": [item, dict(item, request_id=2, inputs=[])], "forget_regions": ["r"],
           "t": "execute"}
    doc.update(over)
    return doc


def generic_decode(raw: bytes) -> object:
    header = json.loads(raw)
    cls = m.MESSAGE_TYPES[header.pop("t")]
    return wire_codec._build(cls, header)


def test_execute_fast_equals_build():
    raw = json.dumps(execute_json()).encode()
    fast, frames = m.decode([raw, b"12345678"])
    assert fast == generic_decode(raw)
    assert isinstance(fast, m.Execute) and isinstance(fast.requests[0], m.RequestItem)
    assert isinstance(fast.requests[0].inputs[0], m.TensorRef) and frames == [b"12345678"]
    assert repr(fast) == repr(generic_decode(raw))


def generic_or_refused(raw: bytes) -> object:
    """What the generic decoder makes of `raw`; or, when it fails, None once `m.decode` is checked to refuse
    `raw` with the same error."""
    try:
        return generic_decode(raw)
    except (ValueError, KeyError, TypeError) as exc:
        with pytest.raises(m.ProtocolError) as got:
            m.decode([raw])
        assert str(got.value) == "malformed message: %s" % exc
        return None


def broken(doc: dict, path: tuple, value: object) -> bytes:
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize("path,value", [
    (("forget_regions",), KeyError),  # optional field left out: default
    (("requests", 1, "flags"), KeyError),
    (("requests", 1, "inputs"), [{"name": "X", "datatype": "FP32", "shape": [1], "frame": 0}]),
    (("requests", 1, "extra"), 1),  # unknown fields are protocol errors
    (("requests", 1, "inputs"), [{"name": "X", "datatype": "FP32", "shape": [1], "bogus": 0}]),
    (("requests", 1, "inputs"), [["not", "an", "object"]]),
    # a data-frame reference (decoded inline) followed by other forms: valid, unknown field, not an object
    (("requests", 1, "inputs"), [{"name": "X", "datatype": "FP32", "shape": [1], "frame": 0, "offset": 0,
                                  "nbytes": 4}, {"name": "Y", "datatype": "FP32", "shape": [1], "loc": "shm",
                                                 "region": "r", "offset": 0, "nbytes": 4}]),
    (("requests", 1, "inputs"), [{"name": "X", "datatype": "FP32", "shape": [1], "frame": 0, "offset": 0,
                                  "nbytes": 4}, {"name": "Y", "datatype": "FP32", "shape": [1], "bogus": 0}]),
    (("requests", 1, "inputs"), [{"name": "X", "datatype": "FP32", "shape": [1], "frame": 0, "offset": 0,
                                  "nbytes": 4}, ["not", "an", "object"]]),
    (("requests", 1, "inputs"), "nope"),
    (("requests", 1), 5),
    (("requests",), {"a": 1}),
    (("batch_id",), KeyError),
    (("extra",), 1),
])
def test_execute_unusual_headers_match_generic(path, value):
    raw = broken(execute_json(), path, value)
    expected = generic_or_refused(raw)
    if expected is not None:
        assert m.decode([raw])[0] == expected


def execute_columns_json() -> dict:
    """An ExecuteColumns as the supervisor writes it (ids and requested outputs given)."""
    return json.loads(m.execute_columns_header(3, [1, 2], [("X", "FP32", [1, 2]), ("N", "INT64", [1])],
                                               ["a", ""], ["Y"], ["r1"]))


COLUMN = {"name": "X", "datatype": "FP32", "shape": [1], "frame": 0}


@pytest.mark.parametrize("path,value", [
    ((), None),  # as written
    (("ids",), KeyError),  # optional fields left out: their defaults (new lists)
    (("requested_outputs",), KeyError),
    (("forget_regions",), KeyError),
    (("inputs",), []),
    (("inputs", 1), {**COLUMN, "extra": 1}),
    (("inputs", 1), {k: v for k, v in COLUMN.items() if k != "frame"}),
    (("inputs", 1), ["not", "an", "object"]),
    (("inputs",), "nope"),
    (("inputs",), KeyError),
    (("request_ids",), KeyError),
    (("batch_id",), KeyError),
    (("extra",), 1),
])
def test_execute_columns_headers_match_generic(path, value):
    doc = execute_columns_json()
    raw = broken(doc, path, value) if path else json.dumps(doc).encode()
    expected = generic_or_refused(raw)
    if expected is not None:
        for loads in (None, header_loads):
            got_message = m.decode_header(raw, loads)
            assert got_message == expected and repr(got_message) == repr(expected)
            assert all(type(column) is m.TensorColumn for column in got_message.inputs)
        left_out = [m.decode_header(raw) for _ in range(2)]  # defaults are lists of their own
        assert left_out[0].ids is not left_out[1].ids


def execute_result_json() -> dict:
    """An ExecuteResult as the worker writes it: items of request_id + outputs only, frame outputs."""
    return json.loads(m.execute_result_header(4, [
        m.response_item_json(1, [m.output_ref_json("A", "FP32", (2,), 0, 0, 8),
                                 m.output_ref_json("B", "INT8", (), 0, 8, 1)]),
        m.response_item_json(2, [m.output_ref_json("A", "FP32", (2,), 0, 9, 8)])], 1, 2, 3))


FRAME_REF = {"name": "X", "datatype": "FP32", "shape": [1], "frame": 0, "offset": 0, "nbytes": 4}


@pytest.mark.parametrize("path,value", [
    ((), None),  # as written
    (("compute_output_ns",), KeyError),  # optional header field left out: default
    (("responses", 0, "outputs"), KeyError),  # outputs left out: []
    (("responses", 0, "outputs"), None),
    (("responses", 0, "outputs"), "nope"),
    (("responses", 0, "request_id"), KeyError),
    (("responses", 0, "parameters"), {"k": 1}),
    (("responses", 0, "error"), None),
    (("responses", 0, "error"), {"code": 3, "message": "x"}),
    (("responses", 0, "error"), {"code": 3}),
    (("responses", 0, "extra"), 1),
    (("responses", 1, "outputs"), [{**FRAME_REF, "loc": "shm", "region": "r"}]),  # not the frame-ref key set
    (("responses", 1, "outputs"), [{"name": "X", "datatype": "FP32", "shape": [1]}]),
    (("responses", 1, "outputs"), [{"name": "X", "datatype": "FP32", "frame": 0, "offset": 0, "nbytes": 4,
                                    "bogus": 1}]),
    (("responses", 1, "outputs"), [{k: v for k, v in FRAME_REF.items() if k != "name"}]),
    (("responses", 1, "outputs"), [["not", "an", "object"]]),
    (("responses", 1), 5),
    (("responses",), {"a": 1}),
    (("batch_id",), KeyError),
    (("extra",), 1),
])
def test_execute_result_unusual_headers_match_generic(path, value):
    doc = execute_result_json()
    doc["t"] = "execute_result"
    raw = broken(doc, path, value) if path else json.dumps(doc).encode()
    expected = generic_or_refused(raw)
    if expected is not None:
        got_message = m.decode([raw])[0]
        assert got_message == expected and repr(got_message) == repr(expected)
        assert all(type(item) is m.ResponseItem and all(type(ref) is m.TensorRef for ref in item.outputs)
                   for item in got_message.responses)


def stream_response_json() -> dict:
    """A StreamResponse as the worker writes one for a token: an item of request_id + outputs, frame outputs."""
    return json.loads(m.stream_response_header(3, False, m.response_item_json(
        3, [m.output_ref_json("text_output", "BYTES", (1, 1), 0, 0, 9)])))


@pytest.mark.parametrize("path,value", [
    ((), None),  # as written
    (("final",), True),
    (("final",), KeyError),  # a field left out: not the fast decoder's shape
    (("response",), None),  # a flag-only final
    (("response",), 5),
    (("response",), [1]),
    (("response", "outputs"), KeyError),
    (("response", "outputs"), "nope"),
    (("response", "request_id"), KeyError),
    (("response", "parameters"), {"k": 1}),
    (("response", "error"), {"code": 3, "message": "x"}),
    (("response", "error"), {"code": 3}),
    (("response", "extra"), 1),
    (("response", "outputs"), [{**FRAME_REF, "loc": "shm", "region": "r"}]),
    (("response", "outputs"), [{"name": "X", "datatype": "FP32", "shape": [1]}]),
    (("response", "outputs"), [{k: v for k, v in FRAME_REF.items() if k != "name"}]),
    (("response", "outputs"), [["not", "an", "object"]]),
    (("request_id",), KeyError),
    (("extra",), 1),
])
def test_stream_response_headers_match_generic(path, value):
    doc = stream_response_json()
    raw = broken(doc, path, value) if path else json.dumps(doc).encode()
    expected = generic_or_refused(raw)
    if expected is not None:
        for loads in (None, orjson.loads):  # the worker's json reading, the supervisor's orjson
            got_message = m.decode([raw], loads)[0]
            assert got_message == expected and repr(got_message) == repr(expected)
            item = got_message.response
            assert item is None or (type(item) is m.ResponseItem and all(type(ref) is m.TensorRef
                                                                         for ref in item.outputs))


@pytest.mark.parametrize("raw", [
    b'{"a":1}', b'{"a":"\xc3\xa9\\u00e9"}', b' {"a":1}', b'{"a":1} ', b'{"a":1}\n', b'{"a":1}x', b'{"a":',
    b'{}', b'{', b'[1]', b'', b'\xef\xbb\xbf{"a":1}', '{"a":1}'.encode("utf-16-le"),
    '{"a":1}'.encode("utf-16"), b'{"a":"\xff"}', b'{"a":NaN}', b'{"a":1,"a":2}', b'{"a":"\\ud800"}',
])
def test_loads_equals_json_loads(raw):
    try:
        expected = json.loads(raw)
    except Exception as exc:  # same type and text
        with pytest.raises(type(exc)) as got:
            wire_codec._loads(raw)
        assert str(got.value) == str(exc)
    else:
        got_value = wire_codec._loads(raw)
        assert got_value == expected or (got_value != got_value and expected != expected)
        assert type(got_value) is type(expected)


@pytest.mark.parametrize("raw", [
    b'{"a":1}', b'{"a":"\xc3\xa9\\u00e9"}', b' {"a":1}', b'{"a":1} ', b'{"a":1}x', b'{"a":', b'{}', b'{',
    b'\xef\xbb\xbf{"a":1}', b'{"a":"\xff"}', b'{"a":NaN}', b'{"a":1,"a":2}', b'{"a":"\\ud800"}', b'{"a":1E400}',
    b'{"a":9223372036854775807}', b'{"a":18446744073709551615}', b'{"a":18446744073709551616}',
    b'{"a":-9223372036854775809}', b'{"a":"12345678901234567890"}', b'{"a":[1.5,-0.0,1e-400,0.1]}',
    b'{"t":' + b"[" * 5000 + b"]" * 5000 + b"}", json.dumps(execute_json()).encode(),
])
def test_channel_header_loads_equals_json_loads(raw):
    try:
        expected = json.loads(raw)
    except Exception as exc:  # same type and text
        with pytest.raises(type(exc)) as got:
            header_loads(raw)
        assert str(got.value) == str(exc)
    else:
        got_value = header_loads(raw)
        assert repr(got_value) == repr(expected)  # repr: an int that became a float would differ


def test_loads_deep_nesting_is_a_protocol_error():
    with pytest.raises(m.ProtocolError):
        m.decode([b'{"t":' + b"[" * 100000 + b"]" * 100000 + b"}"])


ALL_DTYPES = [np.dtype(c) for c in "?bBhHiIlLqQefdgFD"] + [
    np.dtype(">f4"), np.dtype(">i8"), np.dtype("<u2"), np.dtype(object), np.dtype("S3"), np.dtype("U2"),
    np.dtype([("a", "<f4")]), np.dtype("V4"), np.dtype("M8[s]"),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_from_numpy_cached_equals_uncached(dtype):
    expected = dtypes._from_numpy(dtype)
    for _ in range(2):
        assert dtypes.from_numpy(dtype) == expected
        assert dtypes.from_numpy(dtype.type if dtype.kind not in "SUVM" else dtype) == expected
        assert dtypes.from_numpy(dtype.str) == expected


def test_from_numpy_cache_is_bounded_and_skips_strings():
    for n in range(1, 200):
        assert dtypes.from_numpy(np.dtype("S%d" % n)).name == "BYTES"
        assert dtypes.from_numpy(np.dtype("U%d" % n)).name == "BYTES"
    assert len(dtypes._BY_DTYPE) <= 64
    assert not any(d.kind in "SU" for d in dtypes._BY_DTYPE)


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = "ipc://%s/c.sock" % tmp_path
    router.bind(endpoint)
    channel = Channel(endpoint, "w")
    yield channel, router
    channel.close()
    router.close(0)
    ctx.term()


def test_channel_frames_small_and_big(pair):
    channel, router = pair
    small = np.arange(16, dtype="<f4")
    big = np.arange(m.ZERO_COPY_MIN_BYTES // 4 + 3, dtype="<f4")
    frames = [small.view(np.uint8), big.view(np.uint8), b"bytes", b"", memoryview(b"mv")]
    channel.send(m.Heartbeat(1), frames)
    parts = router.recv_multipart()
    assert parts[0] == b"w" and m.decode(parts[1:])[0] == m.Heartbeat(1)
    assert parts[2:] == [small.tobytes(), big.tobytes(), b"bytes", b"", b"mv"]
    channel.send(m.Bye())
    assert router.recv_multipart()[1:] == m.encode(m.Bye())


def test_channel_refuses_non_buffer_frame_before_sending(pair):
    channel, router = pair
    with pytest.raises(TypeError):
        channel.send(m.Heartbeat(1), [b"ok", object()])
    channel.send(m.Heartbeat(2), [b"next"])
    parts = router.recv_multipart()
    assert m.decode(parts[1:])[0] == m.Heartbeat(2) and parts[2:] == [b"next"]


def test_channel_recv_and_read_ahead(pair):
    channel, router = pair
    channel.send(m.Heartbeat(0))  # makes the worker's identity known to the router
    router.recv_multipart()
    router.send_multipart([b"w", *m.encode(m.Cancel([1, 2]))])
    router.send_multipart([b"w", *m.encode(m.Execute(3, []), [b"abcd", b"ef"])])
    router.send_multipart([b"w", b"{nope"])
    message, frames = channel.recv()
    assert message == m.Cancel([1, 2]) and list(frames) == []
    deadline = 200
    got: list = []
    while len(got) < 1 and deadline:
        got += channel.read_ahead()
        deadline -= 1
        time.sleep(0.01)
    assert got[0][0] == m.Execute(3, []) and [bytes(f) for f in got[0][1]] == [b"abcd", b"ef"]
    assert channel.recv()[0] == m.Execute(3, [])
    with pytest.raises(m.ProtocolError):
        channel.recv()


class FakeChannel:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, message: object, frames: object = ()) -> None:
        self.sent.append((message, list(frames)))  # type: ignore[call-overload]

    def send_encoded(self, header: bytes, frames: object = ()) -> None:
        self.send(m.decode_header(header), frames)

    def read_ahead(self) -> list:
        return []

    def take_pending(self, keep: object) -> None:
        pass


class DoublingBackend:
    name = "fake"

    def execute(self, requests):
        from inferd.worker.backends.base import Response, Tensor

        return [Response([Tensor("Y", "FP32", r.inputs[0].array * 2), Tensor("Z", "FP32", r.inputs[0].array)],
                         parameters={"id": r.id}) for r in requests]


def test_runtime_execute_mixed_batch_keeps_order_and_frame_numbers():
    from inferd.worker.backends.base import ModelSpec
    from inferd.worker.message_loop import Runtime

    channel = FakeChannel()
    runtime = Runtime(channel)  # type: ignore[arg-type]
    config = {"name": "m", "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]},
                                      {"name": "Z", "data_type": "TYPE_FP32", "dims": [-1]}]}
    runtime._backend = DoublingBackend()  # type: ignore[assignment]
    runtime._spec = ModelSpec("m", "/x", "1", json.dumps(config), "fake")
    runtime._results.configure(runtime._spec)
    data = [np.array([1, 2], "<f4").tobytes(), np.array([5], "<f4").tobytes()]
    good = {"name": "X", "datatype": "FP32", "loc": "frame", "region": "", "offset": 0}
    header = {"batch_id": 9, "forget_regions": [], "t": "execute", "requests": [
        {"request_id": 1, "id": "a", "inputs": [dict(good, shape=[2], frame=0, nbytes=8)],
         "requested_outputs": [], "parameters": "{}", "correlation_id": 0, "flags": 0, "timeout_us": 0},
        {"request_id": 2, "id": "b", "inputs": [dict(good, shape=[3], frame=0, nbytes=12)],
         "requested_outputs": [], "parameters": "{}", "correlation_id": 0, "flags": 0, "timeout_us": 0},
        {"request_id": 3, "id": "c", "inputs": [dict(good, shape=[1], frame=1, nbytes=4)],
         "requested_outputs": ["Z"], "parameters": "{}", "correlation_id": 0, "flags": 0, "timeout_us": 0},
    ]}
    message, frames = m.decode([json.dumps(header).encode(), *data])
    runtime._on_execute(message, frames)
    (result, out), = channel.sent
    assert [r.request_id for r in result.responses] == [1, 2, 3]
    first, bad, third = result.responses
    assert bad.error is not None and bad.error.code == 3 and bad.outputs == [] and bad.parameters == {}
    # small outputs share one frame, each at its offset
    assert [(o.name, o.frame, o.offset, o.nbytes, o.shape) for o in first.outputs] == [
        ("Y", 0, 0, 8, [2]), ("Z", 0, 8, 8, [2])]
    assert [(o.name, o.frame, o.offset, o.nbytes, o.shape) for o in third.outputs] == [("Z", 0, 16, 4, [1])]
    assert first.parameters == {"id": "a"} and third.parameters == {"id": "c"}
    assert [bytes(f) for f in out] == [np.array([2, 4], "<f4").tobytes() + data[0] + data[1]]
    assert m.encode_header(result) == generic_header(result)


def test_compact_writer_decodes_to_the_same_messages():
    ref_a = m.output_ref_json("na\u00efve \"x\"", "BYTES", [4], 0, 0, 99)
    ref_b = m.output_ref_json("O", "FP32", (), 1, 8, 4)
    items = [m.response_item_json(5, [ref_a, ref_b], None, {"k": "v", "n": [1, 2]}),
             m.response_item_json(6, [], m.WireError(3, 'bad "input" \u00e9\n\u2603')),
             m.response_item_json(1 << 70, [])]
    header = m.execute_result_header(7, items, 1, 2, 3)
    expected = m.ExecuteResult(7, [
        m.ResponseItem(5, [m.TensorRef("na\u00efve \"x\"", "BYTES", [4], "frame", 0, "", 0, 99),
                           m.TensorRef("O", "FP32", [], "frame", 1, "", 8, 4)], None, {"k": "v", "n": [1, 2]}),
        m.ResponseItem(6, [], m.WireError(3, 'bad "input" \u00e9\n\u2603')),
        m.ResponseItem(1 << 70, [])], 1, 2, 3)
    assert m.decode_header(header) == expected
    assert json.loads(header) == {**json.loads(m.encode_header(expected)), "responses": json.loads(header)["responses"]}
    for final, item in ((True, None), (False, items[0]), (True, items[1])):
        got = m.decode_header(m.stream_response_header(5, final, item))
        assert got == m.StreamResponse(5, final, None if item is None else m.decode_header(header).responses[
            0 if item is items[0] else 1])


def test_frame_packer_shares_one_frame_for_small_buffers():
    packer = m.FramePacker()
    big = bytes(m.ZERO_COPY_MIN_BYTES)
    assert packer.add(b"ab", 2) == (0, 0)
    assert packer.add(big, len(big)) == (1, 0)
    assert packer.add(b"", 0) == (2, 0)  # an empty frame of its own: (0, 0) means a whole frame
    assert packer.add(memoryview(b"cde"), 3) == (0, 2)
    assert [bytes(f) for f in packer.finish()] == [b"abcde", big, b""]
    assert m.FramePacker().finish() == []
    one = m.FramePacker()
    one.add(b"xy", 2)
    assert one.finish() == [b"xy"]


def test_fast_decoders_spell_out_the_tensor_ref_required_fields():
    assert frozenset(("name", "datatype", "shape")) == wire_codec._TENSOR_REQUIRED


def test_fast_lanes_key_sets_are_valid_shapes_of_their_classes():
    """The key sets the fast decoders compare against hold every required field and only real ones."""
    for keys, cls in ((wire_codec._FRAME_REF_KEYS, m.TensorRef), (wire_codec._PLAIN_ITEM_KEYS, m.ResponseItem),
                      (wire_codec._PLAIN_REQUEST_KEYS, m.RequestItem)):
        assert wire_codec._required(cls) <= keys <= frozenset(wire_codec._field_names(cls)), cls
    # and they are what the writers write for the common case
    assert json.loads(m.output_ref_json("A", "FP32", (1,), 0, 0, 4)).keys() == wire_codec._FRAME_REF_KEYS
    assert json.loads(m.response_item_json(1, [])).keys() == wire_codec._PLAIN_ITEM_KEYS
    inputs = [m.tensor_ref("A", "FP32", [1], "frame", 0, "", 0, 4)]
    assert inputs[0].keys() == wire_codec._FRAME_REF_KEYS
    assert m.request_item(1, "", inputs, []).keys() == wire_codec._PLAIN_REQUEST_KEYS
