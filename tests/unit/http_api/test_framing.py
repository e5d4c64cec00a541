"""Hostile HTTP/1.1 framing (issue 38 items 1 and 5): trailer fields and chunk framing are capped as a head
is and never become request headers; a connection that sends without progress is cut off; `Upgrade:` is
ignored as Triton ignores it (the request is answered once, with its body, and what is pipelined after it
is served); CONNECT is answered once and ends the connection; bytes after a request without keep-alive are
dropped, not answered with a 400 in place of that request's answer.

No stray answer is proven by order: a last request of our own must get the next answer, or the server
must close with nothing more written."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import SHORT_TIMEOUT, LoopThread, Served, _serve
from .rawhttp import RawConn, build, error_of, request
from .test_limits import HttpServerProcess

PARAMS = "/v2/models/params/infer"
IDENT = "/v2/models/identity_FP32/infer"
LIVE = build("GET", "/v2/health/live")
METADATA = build("GET", "/v2/models/params")
CHUNKED = {"Transfer-Encoding": "chunked"}


def _infer(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()


def _chunks(body: bytes, piece: int = 7) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + piece]), body[i:i + piece]) for i in range(0, len(body), piece))


def _out(raw: bytes) -> Any:
    return json.loads(raw)["outputs"][0]["data"]


def _next_is_metadata(conn: RawConn) -> None:
    """The connection is still HTTP and in step: our metadata request gets the next answer."""
    conn.send(METADATA)
    status, _, raw = conn.read_response()
    assert status == 200 and json.loads(raw)["name"] == "params", raw[:200]


def _nothing_more(conn: RawConn) -> None:
    """The server closes the connection without writing anything more."""
    assert conn.wait_closed()
    assert bytes(conn.buf) == b"", f"a stray answer: {bytes(conn.buf[:200])!r}"


# ---- trailers and chunk framing ----
def test_trailer_fields_are_not_request_headers(served: Served) -> None:
    """Before: trailer fields were merged into the headers, after the body cap was decided: a trailer
    `Inference-Header-Content-Length: 5` split the JSON body at byte 5 (400). Triton ignores trailers."""
    body = _infer([1, 2, 3])
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", PARAMS, headers=CHUNKED) + _chunks(body)
                  + b"0\r\nInference-Header-Content-Length: 5\r\nContent-Type: text/x\r\n\r\n")
        status, _, raw = conn.read_response()
        assert status == 200, raw[:200]
        assert _out(raw) == [1, 2, 3]
        _next_is_metadata(conn)
    finally:
        conn.close()


def _flood(port: int, prefix: bytes, filler: bytes, total: int) -> dict[str, Any]:
    """Send `prefix`, then `filler` up to `total` bytes while a thread reads the answer; how it went:
    `sent` (bytes of filler sent before the answer came), `answer`, `closed_after` (seconds from the
    start to the server's close; None when it did not close while sending)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    got: dict[str, Any] = {"answer": b"", "closed_after": None}
    sent = [0]
    start = time.monotonic()

    def read() -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                if not got["answer"]:
                    got["sent"] = sent[0]
                got["answer"] += data
        except OSError:
            pass
        got["closed_after"] = time.monotonic() - start

    reader = threading.Thread(target=read)
    reader.start()
    try:
        sock.sendall(prefix)
        while sent[0] < total and got["closed_after"] is None:
            sock.sendall(filler)
            sent[0] += len(filler)
    except OSError:
        pass
    got.setdefault("sent", sent[0])
    sock.shutdown(socket.SHUT_WR)
    reader.join(30)
    sock.close()
    return got


TRAILER_START = build("POST", PARAMS, headers=CHUNKED) + b"5\r\n{\"a\":\r\n0\r\nX-Trailer: "


@pytest.mark.parametrize("prefix", [TRAILER_START, build("POST", PARAMS, headers=CHUNKED) + b"5;ext="],
                         ids=["endless trailer line", "endless chunk extension"])
def test_endless_trailer_or_chunk_line_is_refused_at_the_head_cap(served: Served, prefix: bytes) -> None:
    """Before: httptools buffered the line for as long as the client sent it (the trailer) or skipped it
    forever (the extension), with no answer and no timeout while bytes kept coming."""
    got = _flood(served.port, prefix, b"a" * 4096, 8 << 20)
    assert got["answer"].startswith(b"HTTP/1.1 431 "), got["answer"][:200]
    assert b"16384 bytes" in got["answer"]
    assert got["closed_after"] is not None
    assert request(served.port, "GET", "/v2/health/live")[0] == 200


def test_many_whole_trailer_fields_are_capped_with_the_head(served: Served) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", PARAMS, headers=CHUNKED) + _chunks(_infer([1])) + b"0\r\n"
                  + b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 100) for i in range(200)) + b"\r\n")
        status, _, raw = conn.read_response()
        assert status == 431, raw[:200]
        assert conn.wait_closed()
    finally:
        conn.close()


def test_trailer_sent_without_end_is_timed_out(short_served: Served) -> None:
    """A client that keeps sending trailer bytes slowly (below the cap) is cut off after the body timeout:
    before, every byte read reset the timeout, so it held the connection forever."""
    sock = socket.create_connection(("127.0.0.1", short_served.port), timeout=10)
    closed = threading.Event()

    def read() -> None:
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        closed.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        start = time.monotonic()
        sock.sendall(build("POST", PARAMS, headers=CHUNKED) + b"5\r\n{\"a\":\r\n0\r\nX-Slow: ")
        deadline = start + SHORT_TIMEOUT + 5
        while not closed.is_set() and time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            closed.wait(SHORT_TIMEOUT / 10)
        assert closed.wait(1.0), "still open while trailer bytes trickle in"
        assert time.monotonic() - start < SHORT_TIMEOUT + 3
    finally:
        sock.close()


def test_trailer_flood_memory_and_other_clients() -> None:
    """64 MiB of one trailer line (issue 38 item 1: before, RSS grew with the bytes sent and kept them, the
    server burnt CPU quadratically re-joining the line and other clients waited seconds). Now: 431 after at
    most the head cap and a read, the connection closed within seconds, RSS flat, other clients answered."""
    server = HttpServerProcess(1 << 20)
    try:
        rss0 = server.rss_mib()
        cpu0 = server.cpu_s()
        worst = [0.0]
        stop = threading.Event()

        def poll_ready() -> None:
            conn = RawConn(server.port, timeout=30)
            try:
                while not stop.is_set():
                    t = time.monotonic()
                    conn.send(build("GET", "/v2/health/ready"))
                    assert conn.read_response()[0] == 200
                    worst[0] = max(worst[0], time.monotonic() - t)
                    stop.wait(0.01)
            finally:
                conn.close()

        poller = threading.Thread(target=poll_ready)
        poller.start()
        got = _flood(server.port, TRAILER_START, b"a" * 65536, 64 << 20)
        stop.set()
        poller.join(30)
        rss = server.rss_mib()
        print(f"\ntrailer flood: 431 after {got['sent'] >> 10} KiB, closed after {got['closed_after']:.2f} s, "
              f"server CPU {server.cpu_s() - cpu0:.2f} s, RSS {rss0:.0f} -> {rss:.0f} MiB, "
              f"worst /v2/health/ready {worst[0] * 1000:.0f} ms")
        assert got["answer"].startswith(b"HTTP/1.1 431 "), got["answer"][:200]
        assert got["sent"] < 32 << 20  # (what the client sent includes what the socket buffers held)
        assert got["closed_after"] is not None and got["closed_after"] < 10
        assert rss <= rss0 + 24, f"RSS {rss:.0f} MiB after the flood, {rss0:.0f} before"
        assert worst[0] < 2.0
        assert request(server.port, "GET", "/v2/health/live")[0] == 200
    finally:
        server.stop()


# ---- Upgrade and CONNECT ----
UPGRADES = {
    "h2c": {"Upgrade": "h2c", "Connection": "Upgrade, HTTP2-Settings", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"},
    "websocket": {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                  "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("kind", list(UPGRADES))
def test_upgrade_is_ignored_and_the_request_read_with_its_body(served: Served, kind: str, chunked: bool) -> None:
    """Before: llhttp ended the request at its head (an infer with an empty body: 400), then the body
    was parsed as the next request (a second, unsolicited 400) and the connection closed, so the request
    pipelined after it was never answered."""
    body = _infer([4, 5, 6])
    if chunked:
        first = build("POST", PARAMS, headers={**UPGRADES[kind], **CHUNKED}) + _chunks(body) + b"0\r\n\r\n"
    else:
        first = build("POST", PARAMS, body, UPGRADES[kind])
    conn = RawConn(served.port)
    try:
        conn.send(first + build("POST", PARAMS, _infer([7])))
        status, headers, raw = conn.read_response()
        assert status == 200 and _out(raw) == [4, 5, 6], raw[:200]
        assert "upgrade" not in headers
        status, _, raw = conn.read_response()
        assert status == 200 and _out(raw) == [7], raw[:200]
        _next_is_metadata(conn)
    finally:
        conn.close()


def test_upgrade_without_a_body_then_pipelined(served: Served) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(build("GET", "/v2/health/live", headers=UPGRADES["h2c"]) + build("POST", PARAMS, _infer([2])))
        assert conn.read_response()[0] == 200
        status, _, raw = conn.read_response()
        assert status == 200 and _out(raw) == [2]
        _next_is_metadata(conn)
    finally:
        conn.close()


def test_upgrade_split_across_reads_with_expect(served: Served) -> None:
    """The head, 100 Continue, then the body in pieces: the held request still gets its body."""
    body = _infer([9, 8])
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", PARAMS, headers={**UPGRADES["websocket"], "Expect": "100-continue",
                                                 "Content-Length": str(len(body))}, content_length=False))
        assert conn.read_response()[0] == 100
        for i in range(0, len(body), 10):
            conn.send(body[i:i + 10])
        status, _, raw = conn.read_response()
        assert status == 200 and _out(raw) == [9, 8], raw[:200]
        _next_is_metadata(conn)
    finally:
        conn.close()


def test_pipelined_upgrades_one_after_another(served: Served) -> None:
    data = b"".join(build("POST", PARAMS, _infer([i]), UPGRADES["h2c"]) for i in range(4))
    conn = RawConn(served.port)
    try:
        conn.send(data)
        assert [_out(conn.read_response()[2]) for _ in range(4)] == [[0], [1], [2], [3]]
        _next_is_metadata(conn)
    finally:
        conn.close()


def test_upgrade_that_closes_is_answered_once(served: Served) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(build("POST", PARAMS, _infer([3]), {"Upgrade": "h2c", "Connection": "Upgrade, close"}) + LIVE)
        status, headers, raw = conn.read_response()
        assert status == 200 and _out(raw) == [3] and headers.get("connection") == "close"
        _nothing_more(conn)
    finally:
        conn.close()


@pytest.mark.parametrize("extra", [b"\r\n", b"Content-Length: 5\r\n\r\nhello", b"\r\n\x16\x03\x01\x02\x00\x01\x00"],
                         ids=["bare", "with a body", "tunnel bytes"])
def test_connect_is_answered_once_and_ends_the_connection(served: Served, extra: bytes) -> None:
    """Before: 404 (as Triton), then whatever followed was parsed as a request: a second, unsolicited 400."""
    head = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n"
    conn = RawConn(served.port)
    try:
        conn.send(head + extra + LIVE)
        status, headers, raw = conn.read_response()
        assert status == 404 and error_of(raw) == "Not Found"
        assert headers.get("connection") == "close"
        _nothing_more(conn)
    finally:
        conn.close()


# ---- bytes after the last request ----
@pytest.fixture
def gated(served: Served) -> Iterator[Served]:
    """Infer requests to the `gate` model wait until released: a request still running when more bytes come."""
    import asyncio

    dp = served.dp

    async def arm() -> None:
        dp.gate = asyncio.Event()
        dp.gate_entered = asyncio.Event()

    served.lt.run(arm())
    yield served
    dp.gate = None


def _release(lt: LoopThread, dp: Any) -> None:
    import asyncio

    async def release() -> None:
        await asyncio.wait_for(dp.gate_entered.wait(), 10)
        dp.gate.set()

    lt.run(release())


@pytest.mark.parametrize("first", [
    build("POST", "/v2/models/gate/infer", _infer([5]), {"Connection": "close"}),
    b"POST /v2/models/gate/infer HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(_infer([5])), _infer([5])),
], ids=["Connection: close", "HTTP/1.0"])
def test_bytes_after_the_last_request_are_dropped(gated: Served, first: bytes) -> None:
    """Before: llhttp refuses bytes after a request without keep-alive, and that error was answered (400)
    in place of the running request's answer. RFC 9112 9.6: the server answers the request, then closes."""
    conn = RawConn(gated.port)
    try:
        conn.send(first + LIVE + b"\x00garbage")
        _release(gated.lt, gated.dp)
        status, _, raw = conn.read_response()
        assert status == 200 and _out(raw) == [5], raw[:200]
        _nothing_more(conn)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def keep_case(loop_thread: LoopThread) -> Iterator[Served]:
    yield from _serve(loop_thread, header_forward_pattern="^x-")


def test_upgrade_and_trailers_with_headers_kept_as_sent(keep_case: Served) -> None:
    """The server that also keeps headers as sent (KeepCaseConnection, --http-header-forward-pattern): the
    same framing, and a trailer field is not forwarded as a header."""
    conn = RawConn(keep_case.port)
    try:
        conn.send(build("POST", PARAMS, headers={**UPGRADES["h2c"], **CHUNKED, "X-Mine": "1"})
                  + _chunks(_infer([6])) + b"0\r\nX-Trailer: t\r\nInference-Header-Content-Length: 3\r\n\r\n")
        status, _, raw = conn.read_response()
        assert status == 200 and _out(raw) == [6], raw[:200]
        assert keep_case.dp.last_request is not None
        assert dict(keep_case.dp.last_request.parameters) == {"X-Mine": "1"}
        _next_is_metadata(conn)
    finally:
        conn.close()
