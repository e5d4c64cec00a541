"""A request with both Content-Length and Transfer-Encoding: chunked (issue 43 item 10, Triton's qa L0_http):
Triton reads the body as chunked; inferd answered 400. RFC 9112 6.3 lets a server read such a request by its
Transfer-Encoding alone if it closes the connection after answering: inferd does both, and what was sent
after the request is dropped, never served. The ambiguous forms stay refused (any other coding beside a
Content-Length, duplicate Content-Lengths, an invalid Transfer-Encoding)."""

from __future__ import annotations

import json

import pytest

from .conftest import Served
from .rawhttp import RawConn, error_of

PARAMS = "/v2/models/params/infer"
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"


def _infer(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()


def _chunks(body: bytes, piece: int = 9) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + piece]), body[i:i + piece]) for i in range(0, len(body), piece))
    return out + b"0\r\n\r\n"


def _head(*fields: str) -> bytes:
    return ("\r\n".join([f"POST {PARAMS} HTTP/1.1", "Host: t", *fields]) + "\r\n\r\n").encode()


@pytest.mark.parametrize("fields", [
    ("Content-Length: 5", "Transfer-Encoding: chunked"),
    ("Transfer-Encoding: chunked", "Content-Length: 5"),
    ("Content-Length: 100000", "Transfer-Encoding: Chunked"),  # (a length that would be refused as a lie)
], ids=["length-first", "chunked-first", "long-length"])
def test_chunked_wins_over_content_length_and_the_connection_closes(served: Served, fields) -> None:
    body = _infer([4, 5, 6])
    conn = RawConn(served.port)
    try:
        conn.send(_head(*fields) + _chunks(body) + LIVE)  # (a request pipelined after it: dropped)
        status, headers, raw = conn.read_response()
        assert status == 200, raw[:300]
        assert json.loads(raw)["outputs"][0]["data"] == [4, 5, 6]
        assert headers.get("connection", "").lower() == "close"
        assert conn.wait_closed()
        assert bytes(conn.buf) == b"", f"the pipelined request was answered: {bytes(conn.buf[:200])!r}"
    finally:
        conn.close()


def test_chunked_over_length_in_pieces_with_expect(served: Served) -> None:
    """The same request read a few bytes at a time, asking 100-continue first."""
    body = _infer([7])
    data = _head("Content-Length: 3", "Expect: 100-continue", "Transfer-Encoding: chunked")
    conn = RawConn(served.port)
    try:
        conn.send(data)
        status, _, _ = conn.read_response()
        assert status == 100
        rest = _chunks(body, 4)
        for i in range(0, len(rest), 5):
            conn.send(rest[i:i + 5])
        status, headers, raw = conn.read_response()
        assert status == 200 and json.loads(raw)["outputs"][0]["data"] == [7], raw[:300]
        assert conn.wait_closed()
    finally:
        conn.close()


@pytest.mark.parametrize("fields,why", [
    (("Content-Length: 3", "Transfer-Encoding: gzip"), "Transfer-Encoding"),
    (("Transfer-Encoding: xchunked", "Content-Length: 3"), "Transfer-Encoding"),
    (("Content-Length: 3", "Transfer-Encoding: gzip, chunked"), "Transfer-Encoding"),
    (("Content-Length: 3", "Transfer-Encoding: chunked, identity"), "Transfer-Encoding"),
    (("Content-Length: 3", "Content-Length: 4", "Transfer-Encoding: chunked"), "Content-Length"),
    (("Content-Length: 3", "Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), "Transfer-Encoding"),
], ids=["gzip", "xchunked", "gzip-chunked", "chunked-identity", "two-lengths", "two-encodings"])
def test_ambiguous_framing_is_still_refused(served: Served, fields, why) -> None:
    conn = RawConn(served.port)
    try:
        conn.send(_head(*fields) + b"abc")
        status, _, raw = conn.read_response()
        assert status == 400, raw[:300]
        assert why in error_of(raw)
        assert conn.wait_closed()
    finally:
        conn.close()
