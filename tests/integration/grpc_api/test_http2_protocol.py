"""inferd's own HTTP/2 gRPC server (grpc_api/native_server.py over grpc_api/http2) driven frame by frame
from a raw socket (_h2client.H2Client), against the in-test DataPlane of _server_main.py.

After every test a fresh tritonclient call must still work: nothing here may hurt the server.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from inferd.supervisor.grpc_api.http2 import frames as f
from tritonclient.grpc import service_pb2
from unit.grpc_api._h2client import SERVICE, H2Client, grpc_message, request_headers

from ._spawn import serve

LIVE = b""  # ServerLiveRequest has no fields


@pytest.fixture()
def url(native_url: str) -> Iterator[str]:
    yield native_url
    with grpcclient.InferenceServerClient(native_url) as client:  # the server still serves
        assert client.is_server_live()
        data = np.arange(4, dtype=np.int32)
        inp = grpcclient.InferInput("INPUT0", [4], "INT32")
        inp.set_data_from_numpy(data)
        assert np.array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), data)


@pytest.fixture()
def h2(url: str) -> Iterator[H2Client]:
    client = H2Client(url).start()
    yield client
    client.close()


def _infer_request(model: str, data: bytes, datatype: str = "UINT8", **kw: str) -> bytes:
    req = service_pb2.ModelInferRequest(model_name=model, id=kw.get("id", ""))
    itemsize = np.dtype(np.int32).itemsize if datatype == "INT32" else 1
    req.inputs.add(name="INPUT0", datatype=datatype, shape=[len(data) // itemsize])
    req.raw_input_contents.append(data)
    return req.SerializeToString()


def _infer_output(resp_bytes: bytes) -> bytes:
    return bytes(service_pb2.ModelInferResponse.FromString(resp_bytes).raw_output_contents[0])


def _count(url: str, model: str, want: int) -> int:
    """The in-test DataPlane's count of started / cancelled `slow` requests, once it reaches `want`."""
    with grpcclient.InferenceServerClient(url) as client:
        inp = grpcclient.InferInput("WANT", [1], "INT32")
        inp.set_data_from_numpy(np.array([want], dtype=np.int32))
        return int(client.infer(model, [inp]).as_numpy("COUNT")[0])


# ---- connection set-up and the plain calls ----
def test_preface_and_settings_exchange(h2: H2Client) -> None:
    settings = h2.wait_for(f.SETTINGS)
    assert not settings.flags & f.ACK and settings.sid == 0
    got = dict(f.parse_settings(settings.payload))
    assert got[f.INITIAL_WINDOW_SIZE] == 4 * 1024 * 1024
    assert got[f.MAX_FRAME_SIZE] == 1024 * 1024
    assert got[f.MAX_CONCURRENT_STREAMS] >= 100
    update = h2.wait_for(f.WINDOW_UPDATE, 0)  # the connection window raised to 64 MiB
    assert f.u32(update.payload) + f.DEFAULT_WINDOW == 64 * 1024 * 1024
    h2.wait_for(f.SETTINGS)  # the ACK of ours (only ACKs are left in the backlog)
    assert h2.settings_acked == 1


def test_unary_server_live_and_infer(h2: H2Client) -> None:
    resp = h2.unary("ServerLive", LIVE)
    assert resp.headers[":status"] == "200" and resp.headers["content-type"] == "application/grpc"
    assert resp.trailers == {"grpc-status": "0"}
    assert [fr.type for fr in resp.frames] == [f.HEADERS, f.DATA, f.HEADERS]
    assert service_pb2.ServerLiveResponse.FromString(resp.messages()[0]).live
    data = np.arange(100, dtype=np.int32).tobytes()
    resp = h2.unary("ModelInfer", _infer_request("identity", data, "INT32", id="r7"))
    assert resp.status == 0
    out = service_pb2.ModelInferResponse.FromString(resp.messages()[0])
    assert out.id == "r7" and bytes(out.raw_output_contents[0]) == data
    # many calls on one connection, several streams open at once
    sids = []
    for i in range(20):
        sid = h2.new_stream()
        h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
        sids.append((sid, i))
    for sid, i in reversed(sids):
        h2.send_data(sid, grpc_message(_infer_request("identity", bytes([i]) * (i + 1))))
    for sid, i in sids:
        assert _infer_output(h2.response(sid).messages()[0]) == bytes([i]) * (i + 1)


def test_headers_over_continuation_frames(h2: H2Client) -> None:
    sid = h2.new_stream()
    fields = request_headers(SERVICE + "ModelInfer", x_padding="p" * 3000)
    h2.send(h2.headers(sid, fields, pieces=4))
    h2.send_data(sid, grpc_message(_infer_request("identity", b"abc")))
    resp = h2.response(sid)
    assert resp.status == 0 and _infer_output(resp.messages()[0]) == b"abc"
    # a frame other than CONTINUATION in the middle of a header block is a connection error
    sid = h2.new_stream()
    first = h2.headers(sid, request_headers(SERVICE + "ServerLive"), pieces=2)
    cut = 9 + f.parse_header(first, 0)[0]
    h2.send(first[:cut] + f.header(8, f.PING, 0, 0) + b"12345678")
    goaway = h2.wait_for(f.GOAWAY)
    assert f.u32(goaway.payload[4:]) == f.PROTOCOL_ERROR


def test_every_frame_split_into_one_byte_writes(url: str) -> None:
    client = H2Client(url)
    try:
        sid = client.new_stream()
        data = bytes(range(256)) * 4
        wire = (
            client.opening()
            + client.headers(sid, request_headers(SERVICE + "ModelInfer"))
            + client.data_frame(sid, grpc_message(_infer_request("identity", data)), end_stream=True)
            + f.header(8, f.PING, 0, 0)
            + b"pingpong"
        )
        client.send(wire, bytewise=True)
        resp = client.response(sid)
        assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
        assert client.wait_for(f.PING).payload == b"pingpong"
    finally:
        client.close()


def test_ping_is_acknowledged(h2: H2Client) -> None:
    h2.send(f.header(8, f.PING, 0, 0) + b"\x01\x02\x03\x04\x05\x06\x07\x08")
    ack = h2.wait_for(f.PING)
    assert ack.flags & f.ACK and ack.sid == 0 and ack.payload == b"\x01\x02\x03\x04\x05\x06\x07\x08"
    h2.send(f.header(8, f.PING, f.ACK, 0) + b"ignored!")  # an ACK is not answered
    assert h2.unary("ServerLive", LIVE).status == 0
    assert not [fr for fr in h2.backlog if fr.type == f.PING]


# ---- flow control ----
def test_request_larger_than_the_stream_window(url: str) -> None:
    # we take any amount back, so only the server's windows pace this
    client = H2Client(url, {f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW, f.MAX_FRAME_SIZE: 1 << 20}, 1 << 30).start()
    try:
        client.wait_for(f.SETTINGS)  # the server's stream window (4 MiB) and max frame (1 MiB)
        data = np.random.default_rng(0).integers(0, 256, 10 * 1024 * 1024, dtype=np.uint8).tobytes()
        sid = client.new_stream()
        client.send(client.headers(sid, request_headers(SERVICE + "ModelInfer")))
        waits = client.send_data(sid, grpc_message(_infer_request("identity", data)))
        assert waits >= 1  # the 4 MiB stream window ran out and was given back
        assert sum(inc for s, inc in client.window_updates if s == sid) >= len(data) - 4 * 1024 * 1024
        resp = client.response(sid, give_back=False)
        assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
    finally:
        client.close()


def test_response_larger_than_a_small_client_window(url: str) -> None:
    client = H2Client(url, {f.INITIAL_WINDOW_SIZE: 1000, f.MAX_FRAME_SIZE: 16384}).start()
    try:
        client.wait_for(f.SETTINGS)
        client.wait_for(f.SETTINGS)  # the server's ACK: it now knows our small windows
        data = bytes(range(256)) * 800  # 200 KiB: over the 64 KiB connection window too
        resp = client.unary("ModelInfer", _infer_request("identity", data))
        assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
        sizes = [len(fr.payload) for fr in resp.frames if fr.type == f.DATA]
        assert max(sizes) <= 1000 and len(sizes) >= len(data) // 1000  # paced by our stream window
        # the books were checked frame by frame (H2Client._account): never above a window
        # a larger stream window: frames up to our max frame size, paced by the connection window
        client.change_settings({f.INITIAL_WINDOW_SIZE: 1 << 20})
        resp = client.unary("ModelInfer", _infer_request("identity", data))
        assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
        assert max(len(fr.payload) for fr in resp.frames if fr.type == f.DATA) == 16384
    finally:
        client.close()


def test_response_waits_for_a_window_update(url: str) -> None:
    client = H2Client(url, {f.INITIAL_WINDOW_SIZE: 0}).start()
    try:
        client.wait_for(f.SETTINGS)
        client.wait_for(f.SETTINGS)
        sid = client.new_stream()
        client.send(client.headers(sid, request_headers(SERVICE + "ServerLive")))
        client.send_data(sid, grpc_message(LIVE))
        head = client.wait_for(f.HEADERS, sid)  # headers are not flow controlled, DATA is
        assert client.header_block(head)[":status"] == "200"
        client.backlog.appendleft(head)  # read again below
        client.send(f.window_update(sid, 100))
        client.stream_recv[sid] += 100
        resp = client.response(sid)
        assert resp.trailers == {"grpc-status": "0"} and len(resp.messages()) == 1
    finally:
        client.close()


# ---- what the server refuses ----
def test_unknown_method_is_unimplemented(h2: H2Client) -> None:
    resp = h2.unary("/inference.GRPCInferenceService/NoSuchMethod", LIVE)
    assert resp.headers[":status"] == "200" and resp.status == 12
    assert "NoSuchMethod" in resp.headers["grpc-message"]
    resp = h2.unary("ServerLive", LIVE, grpc_encoding="snappy")
    assert resp.status == 12 and "snappy" in resp.headers["grpc-message"]
    assert h2.unary("ServerLive", LIVE).status == 0


def test_get_is_405_and_text_plain_is_415(h2: H2Client) -> None:
    sid = h2.new_stream()
    fields = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x")]
    h2.send(h2.headers(sid, fields, end_stream=True))
    assert h2.response(sid).headers[":status"] == "405"
    sid = h2.new_stream()
    fields = request_headers(SERVICE + "ServerLive")
    fields[4] = ("content-type", "text/plain")
    h2.send(h2.headers(sid, fields))
    resp = h2.response(sid)
    assert resp.headers[":status"] == "415"
    h2.send(h2.data_frame(sid, b"late body", end_stream=True))  # dropped, not a connection error
    assert h2.unary("ServerLive", LIVE).status == 0


def test_grpc_timeout_on_a_slow_request(url: str, h2: H2Client) -> None:
    cancelled = _count(url, "cancelled", 0)
    resp = h2.unary("ModelInfer", _infer_request("slow", b"\0\0\0\0", "INT32"), grpc_timeout="300m")
    assert resp.status == 4 and resp.headers["grpc-message"] == "Deadline Exceeded"
    assert _count(url, "cancelled", cancelled + 1) == cancelled + 1  # the data plane saw the cancel
    assert h2.unary("ServerLive", LIVE).status == 0


def test_rst_stream_mid_request_and_while_running(url: str, h2: H2Client) -> None:
    # half a request, then RST_STREAM: nothing comes back, the connection keeps serving
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
    body = grpc_message(_infer_request("identity", b"x" * 5000))
    h2.send(h2.data_frame(sid, body[:2000]))
    h2.send(f.rst_stream(sid, f.CANCEL))
    assert h2.unary("ServerLive", LIVE).status == 0
    assert not [fr for fr in h2.backlog if fr.sid == sid and fr.type != f.WINDOW_UPDATE]
    # a running request, reset: the data plane's request is cancelled
    started, cancelled = _count(url, "started", 0), _count(url, "cancelled", 0)
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
    h2.send_data(sid, grpc_message(_infer_request("slow", b"\0\0\0\0", "INT32")))
    _count(url, "started", started + 1)
    h2.send(f.rst_stream(sid, f.CANCEL))
    assert _count(url, "cancelled", cancelled + 1) == cancelled + 1
    h2.send(h2.data_frame(sid, b"after the reset"))  # ignored
    resp = h2.unary("ModelInfer", _infer_request("identity", b"still here"))
    assert _infer_output(resp.messages()[0]) == b"still here"


def test_header_list_too_large_is_refused_and_the_tables_stay_in_step(h2: H2Client) -> None:
    assert h2.unary("ServerLive", LIVE).status == 0  # fills both HPACK tables
    sid = h2.new_stream()
    big = request_headers(SERVICE + "ServerLive", **{f"x_big_{i}": str(i) * 3000 for i in range(30)})
    h2.send(h2.headers(sid, big))
    h2.send_data(sid, grpc_message(LIVE))
    assert h2.response(sid).reset == f.REFUSED_STREAM
    # the next block refers to fields the refused one inserted into the table
    resp = h2.unary("ModelInfer", _infer_request("identity", b"ok"), x_big_29="29" * 1500)
    assert resp.status == 0 and _infer_output(resp.messages()[0]) == b"ok"


def test_long_error_message_fits_the_client_frame_size(h2: H2Client) -> None:
    resp = h2.unary("ModelInfer", _infer_request("m" * 40000, b"x"))  # the error names the model
    assert resp.status == 3  # INVALID_ARGUMENT; H2Client checked each frame against 16 KiB
    assert h2.unary("ServerLive", LIVE).status == 0


def test_http1_request_is_closed(url: str) -> None:
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    assert b"HTTP/1.1" not in got  # nothing but the server's SETTINGS went out


GARBAGE = {
    "oversized": (b"\xff" * 9, f.FRAME_SIZE_ERROR),
    "data_on_stream_0": (f.header(3, f.DATA, 0, 0) + b"abc", f.PROTOCOL_ERROR),
    "bad_ping": (f.header(3, f.PING, 0, 0) + b"abc", f.FRAME_SIZE_ERROR),
    "bad_settings": (f.header(5, f.SETTINGS, 0, 0) + b"\0" * 5, f.FRAME_SIZE_ERROR),
    "bad_hpack": (f.header(1, f.HEADERS, f.END_HEADERS, 3) + b"\x80", f.COMPRESSION_ERROR),
    "even_stream": (f.header(1, f.HEADERS, f.END_HEADERS, 2) + b"\x83", f.PROTOCOL_ERROR),
    "push_promise": (f.header(4, f.PUSH_PROMISE, f.END_HEADERS, 1) + b"\0\0\0\2", f.PROTOCOL_ERROR),
    "bad_window": (f.header(4, f.SETTINGS, 0, 0) + b"\0\4\xff\xff", f.FRAME_SIZE_ERROR),
    "continuation_alone": (f.header(1, f.CONTINUATION, 0, 0) + b"\x83", f.PROTOCOL_ERROR),
    "rst_stream_0": (f.rst_stream(0, f.CANCEL), f.PROTOCOL_ERROR),
    "window_update_0": (f.window_update(0, 0), f.PROTOCOL_ERROR),
    "window_overflow": (f.window_update(0, f.MAX_WINDOW), f.FLOW_CONTROL_ERROR),
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_frame_gets_goaway(url: str, name: str) -> None:
    frame, code = GARBAGE[name]
    client = H2Client(url).start()
    try:
        assert client.unary("ServerLive", LIVE).status == 0
        client.send(frame)
        frames = client.read_until_closed()
        goaway = [fr for fr in frames if fr.type == f.GOAWAY]
        assert len(goaway) == 1
        last_sid, got = struct.unpack(">II", goaway[0].payload[:8])
        assert got == code and last_sid == 1, goaway[0].payload
    finally:
        client.close()


def test_goaway_from_the_client_finishes_open_streams(url: str) -> None:
    client = H2Client(url).start()
    try:
        sid = client.new_stream()
        client.send(client.headers(sid, request_headers(SERVICE + "ServerLive")))
        client.send(f.goaway(0, f.NO_ERROR))
        client.send_data(sid, grpc_message(LIVE))
        assert client.response(sid, give_back=False).status == 0
        client.read_until_closed()  # the server closes once the open stream is done
    finally:
        client.close()


def test_compressed_request_messages(h2: H2Client) -> None:
    import gzip
    import zlib

    data = b"z" * 100_000
    for encoding, pack in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        body = pack(_infer_request("identity", data))
        sid = h2.new_stream()
        h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer", grpc_encoding=encoding)))
        h2.send_data(sid, struct.pack(">BI", 1, len(body)) + body)
        resp = h2.response(sid)
        assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
    # the compressed flag without a grpc-encoding: INTERNAL
    body = gzip.compress(_infer_request("identity", data))
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
    h2.send_data(sid, struct.pack(">BI", 1, len(body)) + body)
    assert h2.response(sid).status == 13


def test_request_without_a_body_is_answered(h2: H2Client) -> None:
    # END_STREAM on the HEADERS: no DATA will come (it used to wait forever)
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive"), end_stream=True))
    resp = h2.response(sid)
    assert resp.status == 12 and "Missing request message" in resp.headers["grpc-message"]
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelStreamInfer"), end_stream=True))
    resp = h2.response(sid)  # a stream with no requests: no answers, OK
    assert resp.status == 0 and resp.data == b""
    # half a message, then END_STREAM: INTERNAL
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive")))
    h2.send_data(sid, grpc_message(b"\x08\x01")[:4])
    assert h2.response(sid).status == 13


def test_stop_sends_goaway_and_drains() -> None:
    """A server of its own: stopping it (grace 1 s) says GOAWAY, finishes the streams already open,
    refuses new ones, cancels what still runs after the grace period, and exits cleanly."""
    server = serve("native")
    own_url = next(server)
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            next(server, None)  # closes the server's stdin, waits for its exit, checks its log
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    client = H2Client(own_url).start()
    stopper = threading.Thread(target=stop)
    try:
        slow = client.new_stream()
        client.send(client.headers(slow, request_headers(SERVICE + "ModelInfer")))
        client.send_data(slow, grpc_message(_infer_request("slow", b"\0\0\0\0", "INT32")))
        _count(own_url, "started", 1)
        live = client.new_stream()  # open, its request not sent yet
        client.send(client.headers(live, request_headers(SERVICE + "ServerLive")))
        client.send(f.header(8, f.PING, 0, 0) + b"pingpong")
        client.wait_for(f.PING)  # the server has seen the HEADERS
        stopper.start()
        goaway = client.wait_for(f.GOAWAY)
        assert struct.unpack(">II", goaway.payload[:8]) == (live, f.NO_ERROR)
        client.send_data(live, grpc_message(LIVE))
        assert client.response(live, give_back=False).status == 0
        late = client.new_stream()
        client.send(client.headers(late, request_headers(SERVICE + "ServerLive"), end_stream=True))
        assert client.response(late, give_back=False).reset == f.REFUSED_STREAM
        rest = client.read_until_closed()  # the slow call is cut off after the grace period
        assert not [fr for fr in rest if fr.sid == slow and fr.type == f.DATA]
    finally:
        client.close()
        if not stopper.is_alive() and not errors and stopper.ident is None:
            stopper.start()
        stopper.join(120)
    assert not stopper.is_alive() and not errors, errors


def test_padding_priority_and_unknown_frames_are_tolerated(h2: H2Client) -> None:
    sid = h2.new_stream()
    block = h2.encoder.encode(request_headers(SERVICE + "ModelInfer"))
    pad = 7
    priority = struct.pack(">IB", 0, 15)  # depends on stream 0, weight 16
    payload = bytes([pad]) + priority + block + b"\0" * pad
    flags = f.END_HEADERS | f.PADDED | f.PRIORITY_FLAG
    h2.send(f.header(len(payload), f.HEADERS, flags, sid) + payload)
    h2.send(f.header(5, f.PRIORITY, 0, sid) + priority)
    h2.send(f.header(3, 0xEE, 0, 0) + b"???")  # unknown frame type: ignored
    body = grpc_message(_infer_request("identity", b"padded"))
    for i in range(0, len(body), 10):  # padded DATA frames, the padding counted against the windows
        piece = body[i : i + 10]
        data = bytes([20]) + piece + b"\0" * 20
        end = f.END_STREAM if i + 10 >= len(body) else 0
        h2.send(f.header(len(data), f.DATA, f.PADDED | end, sid) + data)
    resp = h2.response(sid)
    assert resp.status == 0 and _infer_output(resp.messages()[0]) == b"padded"
    # padding longer than the frame
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive")))
    h2.send(f.header(3, f.DATA, f.PADDED, sid) + b"\x05ab")
    goaway = h2.wait_for(f.GOAWAY)
    assert f.u32(goaway.payload[4:]) == f.PROTOCOL_ERROR


def test_concurrent_responses_share_a_small_connection_window(url: str) -> None:
    client = H2Client(url, {f.INITIAL_WINDOW_SIZE: 20000}).start()
    try:
        client.wait_for(f.SETTINGS)
        client.wait_for(f.SETTINGS)
        payloads = {}
        for i in range(6):
            sid = client.new_stream()
            payloads[sid] = bytes([i]) * (100_000 + i)
            client.send(client.headers(sid, request_headers(SERVICE + "ModelInfer")))
            client.send_data(sid, grpc_message(_infer_request("identity", payloads[sid])))
        for sid, data in payloads.items():  # read one at a time: the others wait for the window
            resp = client.response(sid)
            assert resp.status == 0 and _infer_output(resp.messages()[0]) == data
    finally:
        client.close()


def test_grpc_timeout_units(url: str, h2: H2Client) -> None:
    for value in ("1n", "2u", "1m"):  # already over when the request arrives
        resp = h2.unary("ModelInfer", _infer_request("slow", b"\0\0\0\0", "INT32"), grpc_timeout=value)
        assert resp.status == 4
    for value in ("1H", "99999999S", "junk", "5"):  # long, or not a timeout: no deadline
        assert h2.unary("ServerLive", LIVE, grpc_timeout=value).status == 0


def test_too_many_streams_are_refused(h2: H2Client) -> None:
    limit = dict(f.parse_settings(h2.wait_for(f.SETTINGS).payload))[f.MAX_CONCURRENT_STREAMS]
    sids = [h2.new_stream() for _ in range(limit + 1)]
    h2.send(b"".join(h2.headers(sid, request_headers(SERVICE + "ServerLive")) for sid in sids))
    assert h2.response(sids[-1]).reset == f.REFUSED_STREAM
    # the open ones complete (resetting 4096 at once would be a rapid-reset flood: test_http2_floods.py)
    h2.send(b"".join(h2.data_frame(sid, grpc_message(LIVE), end_stream=True) for sid in sids[:-1]))
    for sid in sids[:-1]:
        assert h2.response(sid).status == 0
    assert h2.unary("ServerLive", LIVE).status == 0


def test_bad_stream_window_update_resets_only_that_stream(h2: H2Client) -> None:
    for increment, code in ((0, f.PROTOCOL_ERROR), (f.MAX_WINDOW, f.FLOW_CONTROL_ERROR)):
        sid = h2.new_stream()
        h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive")))
        h2.send(f.window_update(sid, increment))
        assert h2.response(sid).reset == code
        assert h2.unary("ServerLive", LIVE).status == 0


def test_stream_call_waits_for_a_slow_reader(url: str) -> None:
    """A client that sends stream requests but opens no window for the answers: the server stops
    taking requests after a bounded amount (it used to queue every answer in memory), and once the
    client reads, everything is answered in order."""
    client = H2Client(url, {f.INITIAL_WINDOW_SIZE: 0}).start()
    try:
        client.wait_for(f.SETTINGS)
        client.wait_for(f.SETTINGS)
        sid = client.new_stream()
        client.send(client.headers(sid, request_headers(SERVICE + "ModelStreamInfer")))
        count = 3000
        message = grpc_message(_infer_request("identity", b"s" * 16384))
        payload = memoryview(message * count)  # 48 MiB
        pos = 0
        client.sock.settimeout(3)  # "no window comes back": can only end the loop early, never fail it
        try:
            while pos < len(payload):
                n = min(len(payload) - pos, client.send_window, client.stream_send[sid], client.peer_max_frame)
                if n > 0:
                    client.send(client.data_frame(sid, bytes(payload[pos : pos + n])))
                    pos += n
                else:
                    client.backlog.append(client._read())
        except TimeoutError:
            pass
        client.sock.settimeout(60)
        # bounded by the stream window (4 MiB), the inbox (4 MiB) and the handler's 256 in flight
        assert pos < 20 * 1024 * 1024
        client.change_settings({f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW})
        client.send(f.window_update(0, 1 << 30))
        client.recv_window += 1 << 30
        client.send_data(sid, bytes(payload[pos:]), end_stream=True)
        resp = client.response(sid, give_back=False)
        assert resp.status == 0
        answers = [service_pb2.ModelStreamInferResponse.FromString(m) for m in resp.messages()]
        assert len(answers) == count and not any(a.error_message for a in answers)
    finally:
        client.close()


def test_client_trailers_end_the_request(h2: H2Client) -> None:
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
    h2.send_data(sid, grpc_message(_infer_request("identity", b"t")), end_stream=False)
    h2.send(h2.headers(sid, [("x-trailer", "1")], end_stream=True))
    resp = h2.response(sid)
    assert resp.status == 0 and _infer_output(resp.messages()[0]) == b"t"


def test_error_message_is_percent_encoded(h2: H2Client) -> None:
    resp = h2.unary("ModelInfer", _infer_request("caf\u00e9 100%", b"x"))
    assert resp.status == 3
    assert "caf%C3%A9 100%25" in resp.headers["grpc-message"]


def test_unfinished_request_messages_are_bounded_per_connection(h2: H2Client) -> None:
    # 90 streams each send 3 MiB of an 8 MiB message: 270 MiB would be held, the budget is 256 MiB
    payload = bytes(range(256)) * (32 * 1024)  # 8 MiB
    framed = grpc_message(_infer_request("identity", payload))
    part = 3 * 1024 * 1024
    sids = []
    for _ in range(90):
        sid = h2.new_stream()
        h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
        h2.send_data(sid, framed[:part], end_stream=False)
        sids.append(sid)
    refused = h2.response(sids[-1])  # over the budget: failed at once, not held
    fields = {**refused.headers, **refused.trailers}  # trailers-only: the status is in the headers
    assert refused.status == 8 and "unfinished request messages" in fields.get("grpc-message", "")
    # the oldest unfinished stream still completes
    h2.send_data(sids[0], framed[part:], end_stream=True)
    done = h2.response(sids[0])
    assert done.status == 0 and _infer_output(done.messages()[0]) == payload
    for sid in sids[1:-1]:  # the client gives up on the rest: the server forgets them
        h2.send(f.rst_stream(sid, f.CANCEL))
    assert h2.unary("ServerLive", LIVE).status == 0


def test_client_trailers_after_the_answer_are_ignored(h2: H2Client) -> None:
    # the answer (and our RST_STREAM NO_ERROR) can cross the client's trailers on the wire
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ModelInfer")))
    h2.send_data(sid, grpc_message(_infer_request("identity", b"t")), end_stream=False)
    resp = h2.response(sid)
    assert resp.status == 0 and _infer_output(resp.messages()[0]) == b"t"
    h2.send(h2.headers(sid, [("x-trailer", "1")], end_stream=True))  # late: the stream is closed for us
    assert h2.unary("ServerLive", LIVE).status == 0  # the same connection still serves


def test_an_empty_header_name_is_served_as_metadata(h2: H2Client) -> None:
    """Fuzz finding (http2_frames): a header field with an empty name made reading the request head raise
    IndexError inside data_received, so the connection was dropped without GOAWAY and the error logged."""
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive") + [("", "x")]))
    h2.send_data(sid, grpc_message(LIVE))
    resp = h2.response(sid)
    assert resp.status == 0 and resp.messages() == [b"\x08\x01"]
