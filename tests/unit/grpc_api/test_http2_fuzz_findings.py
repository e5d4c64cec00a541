"""Findings of the HTTP/2 fuzz targets (fuzz/targets/http2_*.py) that need a connection in a given state,
reproduced on an in-memory transport (a socket cannot be made to deliver reads in that state)."""

from __future__ import annotations

import asyncio
from typing import Any

import hpack
from inferd.supervisor.grpc_api.http2 import frames as f
from inferd.supervisor.grpc_api.http2.connection import H2Connection


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.out += p

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False


class _App:
    def __init__(self) -> None:
        self.opened: list[int] = []

    def connection_made(self, conn: H2Connection) -> None:
        pass

    def connection_lost(self, conn: H2Connection) -> None:
        pass

    def open_stream(self, conn: H2Connection, sid: int, headers: Any, end: bool) -> None:
        self.opened.append(sid)
        return None


def _headers(sid: int) -> bytes:
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/x"), ("content-type", "application/grpc")])
    return f.header(len(block), f.HEADERS, f.END_HEADERS | f.END_STREAM, sid) + block


async def _closing_then_error() -> None:
    app, transport = _App(), _Transport()
    conn = H2Connection(app)
    conn.connection_made(transport)  # type: ignore[arg-type]
    try:
        # the client's GOAWAY on an idle connection: we close (gracefully, the transport is closing)
        conn.data_received(f.PREFACE + f.settings({}) + f.goaway(0, f.NO_ERROR))
        assert transport.closed
        # a header block with an index no table has: COMPRESSION_ERROR, on a connection already closing
        conn.data_received(f.header(1, f.HEADERS, f.END_HEADERS | f.END_STREAM, 1) + b"\xbf")
        transport.out.clear()
        # what still arrives (a TLS transport delivers reads until its shutdown is done) is not read
        conn.data_received(_headers(3) + f.ping(b"12345678"))
        assert transport.out == b"", f"frames answered after the connection error: {bytes(transport.out)!r}"
        assert app.opened == []
    finally:
        conn.connection_lost(None)


def test_a_connection_error_while_closing_stops_reading() -> None:
    """Fuzz finding (http2_frames crash-fccab3abb4e38842): a connection error on a connection already closing
    (after the client's GOAWAY) returned before marking the connection cut, so later reads were still
    parsed, with the HPACK context broken, and answered (RST_STREAM for new streams, PING ACKs); the same
    bytes in one read stopped at the error. Now nothing after the error is read."""
    asyncio.run(_closing_then_error())
