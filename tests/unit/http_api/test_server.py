"""The HTTP/1.1 layer: keep-alive, pipelining, chunked bodies, 100-continue, limits, timeouts, close."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from .conftest import MAX_INPUT, SHORT_TIMEOUT
from .rawhttp import RawConn, build, error_of, request


def _json_infer(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()


def test_keep_alive_many_requests(served: Any) -> None:
    conn = RawConn(served.port)
    try:
        for i in range(50):
            conn.send(build("POST", "/v2/models/params/infer", _json_infer([i])))
            status, headers, body = conn.read_response()
            assert status == 200 and "connection" not in headers
            assert json.loads(body)["outputs"][0]["data"] == [i]
    finally:
        conn.close()


def test_pipelined_requests_answered_in_order(served: Any) -> None:
    """A slow request first, fast ones behind it on the same connection: answers keep request order."""
    lt, dp = served.lt, served.dp

    async def arm() -> None:
        dp.gate = asyncio.Event()
        dp.gate_entered = asyncio.Event()

    lt.run(arm())
    conn = RawConn(served.port)
    try:
        batch = build("POST", "/v2/models/gate/infer", _json_infer([1]))
        batch += build("GET", "/v2/health/live")
        batch += build("POST", "/v2/models/params/infer", _json_infer([2]))
        batch += build("GET", "/v2/models/nope")
        conn.send(batch)

        async def release() -> None:
            assert dp.gate is not None and dp.gate_entered is not None
            await asyncio.wait_for(dp.gate_entered.wait(), 5)
            dp.gate.set()

        lt.run(release())
        answers = [conn.read_response() for _ in range(4)]
        assert [a[0] for a in answers] == [200, 200, 200, 400]
        assert json.loads(answers[0][2])["outputs"][0]["data"] == [1]
        assert answers[1][2] == b""
        assert json.loads(answers[2][2])["outputs"][0]["data"] == [2]
    finally:
        dp.gate = None
        conn.close()


def test_held_small_answers_keep_order_with_large_and_closing_ones(served: Any) -> None:
    """Small answers leave at the end of the event-loop pass (http_api/coalesce.py); a large answer,
    written at once, and the close after a `Connection: close` answer must still come after them."""
    big = list(range(20000))  # its JSON answer is over the 64 KiB written without holding
    conn = RawConn(served.port)
    try:
        batch = build("GET", "/v2/health/live")
        batch += build("POST", "/v2/models/params/infer", _json_infer(big))
        batch += build("GET", "/v2/health/ready")
        batch += build("POST", "/v2/models/params/infer", _json_infer([5]))
        batch += build("GET", "/v2/health/live", headers={"Connection": "close"})
        conn.send(batch)
        answers = [conn.read_response() for _ in range(5)]
        assert [a[0] for a in answers] == [200] * 5
        assert answers[0][2] == b"" and answers[2][2] == b""
        assert len(answers[1][2]) > 65536 and json.loads(answers[1][2])["outputs"][0]["data"] == big
        assert json.loads(answers[3][2])["outputs"][0]["data"] == [5]
        assert answers[4][1].get("connection") == "close"
        assert conn.wait_closed()
    finally:
        conn.close()


def test_chunked_request_body(served: Any) -> None:
    body = _json_infer([7, 8, 9])
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 5]), body[i:i + 5]) for i in range(0, len(body), 5))
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", "/v2/models/params/infer", headers={"Transfer-Encoding": "chunked"})
                  + chunks + b"0\r\n\r\n")
        status, _, raw = conn.read_response()
        assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [7, 8, 9]
        # same connection still usable
        conn.send(build("GET", "/v2/health/live"))
        assert conn.read_response()[0] == 200
    finally:
        conn.close()


def test_chunked_body_over_cap_is_413(served: Any) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", "/v2/models/params/infer", headers={"Transfer-Encoding": "chunked"}))
        block = b"x" * 65536
        status = None
        for _ in range(MAX_INPUT // len(block) + 2):
            try:
                conn.send(b"%x\r\n%s\r\n" % (len(block), block))
            except (BrokenPipeError, ConnectionResetError):
                break
        status, _, raw = conn.read_response()
        assert status == 413 and "maximum" in error_of(raw)
        assert conn.wait_closed()
    finally:
        conn.close()


def test_many_tiny_chunks(served: Any) -> None:
    body = _json_infer([3])
    chunks = b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body)))
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", "/v2/models/params/infer", headers={"Transfer-Encoding": "chunked"})
                  + chunks + b"0\r\n\r\n")
        assert conn.read_response()[0] == 200
    finally:
        conn.close()


def test_expect_100_continue(served: Any) -> None:
    body = _json_infer([4])
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", "/v2/models/params/infer", headers={"Expect": "100-continue",
                                                                   "Content-Length": str(len(body))}))
        status, _, _ = conn.read_response()
        assert status == 100
        conn.send(body)
        status, _, raw = conn.read_response()
        assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [4]
        # too large: refused without 100 Continue
        conn.send(build("POST", "/v2/models/params/infer", headers={"Expect": "100-continue",
                                                                   "Content-Length": str(MAX_INPUT + 1)}))
        status, _, _ = conn.read_response()
        assert status == 413
    finally:
        conn.close()


def test_oversized_header_and_garbage(served: Any) -> None:
    status, _, _ = request(served.port, "GET", "/v2/health/live", headers={"X-Big": "a" * 40000})
    assert status == 431
    conn = RawConn(served.port)
    try:
        conn.send(b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"a" * 40000)  # never finished
        status, _, _ = conn.read_response()
        assert status == 431
    finally:
        conn.close()
    conn = RawConn(served.port)
    try:
        conn.send(b"\x00\x01garbage\r\n\r\n")
        assert conn.read_response()[0] == 400
        assert conn.wait_closed()
    finally:
        conn.close()
    status, _, _ = request(served.port, "GET", "/v2/health/live")
    assert status == 200


def test_partial_headers_closed_after_timeout(short_served: Any) -> None:
    conn = RawConn(short_served.port)
    try:
        start = time.monotonic()
        conn.send(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        assert conn.wait_closed()
        assert time.monotonic() - start < SHORT_TIMEOUT + 1.5
    finally:
        conn.close()


def test_partial_body_closed_after_timeout(short_served: Any) -> None:
    conn = RawConn(short_served.port)
    try:
        start = time.monotonic()
        conn.send(build("POST", "/v2/models/params/infer", headers={"Content-Length": "100"}) + b"{")
        assert conn.wait_closed()
        assert time.monotonic() - start < SHORT_TIMEOUT + 1.5
    finally:
        conn.close()
    assert request(short_served.port, "GET", "/v2/health/live")[0] == 200


def test_idle_keepalive_closed(short_served: Any) -> None:
    conn = RawConn(short_served.port)
    try:
        conn.send(build("GET", "/v2/health/live"))
        assert conn.read_response()[0] == 200
        assert conn.wait_closed()
    finally:
        conn.close()


def test_connection_close_and_http10(served: Any) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(build("GET", "/v2/health/live", headers={"Connection": "close"}))
        status, headers, _ = conn.read_response()
        assert status == 200 and headers["connection"] == "close"
        assert conn.wait_closed()
    finally:
        conn.close()
    conn = RawConn(served.port)
    try:
        conn.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert conn.read_response()[0] == 200
        assert conn.wait_closed()
    finally:
        conn.close()


def test_client_disconnect_cancels_request(served: Any) -> None:
    lt, dp = served.lt, served.dp
    cancelled: dict[str, bool] = {}
    original = type(dp).infer

    async def arm() -> None:
        dp.gate = asyncio.Event()
        dp.gate_entered = asyncio.Event()

    async def watched(self: Any, req: Any) -> Any:
        try:
            return await original(self, req)
        except asyncio.CancelledError:
            cancelled["yes"] = True
            done.set()
            raise

    done = asyncio.Event()
    lt.run(arm())
    dp.infer = watched.__get__(dp)
    try:
        conn = RawConn(served.port)
        conn.send(build("POST", "/v2/models/gate/infer", _json_infer([1])))

        async def entered() -> None:
            assert dp.gate_entered is not None
            await asyncio.wait_for(dp.gate_entered.wait(), 5)

        lt.run(entered())
        conn.close()

        async def wait_cancel() -> None:
            await asyncio.wait_for(done.wait(), 5)

        lt.run(wait_cancel())
        assert cancelled == {"yes": True}
    finally:
        del dp.infer
        dp.gate = None


def test_graceful_close_finishes_in_flight(loop_thread: Any) -> None:
    from inferd.supervisor.http_api import start_http_api

    from .fake_dataplane import FakeDataPlane

    dp = FakeDataPlane()

    async def start() -> Any:
        dp.gate = asyncio.Event()
        dp.gate_entered = asyncio.Event()
        return await start_http_api(dp, "127.0.0.1", 0)

    server = loop_thread.run(start())
    busy = RawConn(server.port)
    idle = RawConn(server.port)
    try:
        idle.send(build("GET", "/v2/health/live"))
        assert idle.read_response()[0] == 200
        busy.send(build("POST", "/v2/models/gate/infer", _json_infer([5])))

        async def close_while_busy() -> None:
            assert dp.gate is not None and dp.gate_entered is not None
            await asyncio.wait_for(dp.gate_entered.wait(), 5)
            server.close()
            closing = asyncio.ensure_future(server.wait_closed(5.0))
            await asyncio.sleep(0)
            dp.gate.set()
            await closing

        loop_thread.run(close_while_busy())
        assert idle.wait_closed()
        status, headers, raw = busy.read_response()
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(raw)["outputs"][0]["data"] == [5]
        try:
            RawConn(server.port).close()
            refused = False
        except OSError:
            refused = True
        assert refused
    finally:
        busy.close()
        idle.close()


def test_large_binary_roundtrip(client: Any) -> None:
    import tritonclient.http as httpclient

    data = np.random.default_rng(0).random(200_000, dtype=np.float32)  # 800 KB each way
    inp = httpclient.InferInput("INPUT0", [data.size], "FP32")
    inp.set_data_from_numpy(data)
    res = client.infer("identity_FP32", [inp])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), data)


def test_metrics_server(metrics_served: Any) -> None:
    status, headers, body = request(metrics_served.port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"nv_inference_count" in body
    assert request(metrics_served.port, "GET", "/v2/health/live")[0] == 404
    assert request(metrics_served.port, "POST", "/metrics")[0] == 405


def test_http10_keep_alive(served: Any) -> None:
    conn = RawConn(served.port)
    try:
        for _ in range(3):
            conn.send(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            status, headers, _ = conn.read_response()
            assert status == 200 and headers["connection"] == "keep-alive"
    finally:
        conn.close()


def test_many_idle_connections_do_not_block(served: Any) -> None:
    idle = [RawConn(served.port) for _ in range(300)]
    try:
        start = time.monotonic()
        assert request(served.port, "GET", "/v2/health/ready")[0] == 200
        assert time.monotonic() - start < 1.0
    finally:
        for conn in idle:
            conn.close()
