"""Streamed (chunked) answers on a real HttpServer: the events of one loop pass leave in one send, a lone
event leaves at once, and the connection stays open for the next request (keep-alive after a stream)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from inferd.supervisor.http_api.connection import HttpConnection
from inferd.supervisor.http_api.generate import StreamingResponse
from inferd.supervisor.http_api.request_cycle import Request
from inferd.supervisor.http_api.server import HttpServer

from .conftest import LoopThread


class CountingTransport:
    """The connection's real transport, counting the writes made on it (each one a send)."""

    def __init__(self, real: Any, log: list[bytes]) -> None:
        self._real = real
        self._log = log

    def write(self, data: Any) -> None:
        self._log.append(bytes(data))
        self._real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class CountingConnection(HttpConnection):
    writes: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        super().connection_made(CountingTransport(transport, CountingConnection.writes))


class Handler:
    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None

    async def answer(self, req: Request) -> StreamingResponse:
        if req.path == "/burst":  # 20 events ready at once (tokens already queued for the stream)
            return StreamingResponse(self._burst())
        return StreamingResponse(self._gated())

    async def _burst(self) -> AsyncIterator[bytes]:
        for i in range(20):
            yield b"data: %d\n\n" % i

    async def _gated(self) -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        assert self.gate is not None
        await self.gate.wait()
        yield b"data: second\n\n"

    def __call__(self, req: Request) -> Any:
        return self.answer(req)


@pytest.fixture(scope="module")
def stream_server(loop_thread: LoopThread) -> Iterator[tuple[HttpServer, Handler]]:
    handler = Handler()

    async def start() -> HttpServer:
        server = HttpServer(handler, max_body=1 << 20)
        server.connection_class = CountingConnection
        await server.start("127.0.0.1", 0)
        return server

    server = loop_thread.run(start())
    yield server, handler
    loop_thread.run(server.wait_closed(2.0))


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    got = b""
    while not got.endswith(end):
        data = sock.recv(65536)
        assert data, f"closed early: {got!r}"
        got += data
    return got


REQ = b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n"


def test_events_ready_in_one_pass_leave_in_one_send_and_the_connection_stays_open(stream_server):
    """Before: one send per event (21 writes for 20 events and the head, and one for the end)."""
    server, _ = stream_server
    CountingConnection.writes = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for _ in range(2):  # twice on one connection: it stays open after a stream
            sock.sendall(REQ % b"/burst")
            got = _read_until(sock, b"\r\n0\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 200") and b"Connection: close" not in got
            assert got.count(b"data: ") == 20
    writes = CountingConnection.writes
    assert len(writes) <= 4, [len(w) for w in writes]  # (at most the first event alone, the rest of the pass)


def test_a_lone_event_leaves_at_once(stream_server, loop_thread):
    """The first event of a stream whose next event is not ready is on the wire before the stream goes on."""
    server, handler = stream_server

    async def arm() -> None:
        handler.gate = asyncio.Event()

    loop_thread.run(arm())
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(REQ % b"/gated")
        got = _read_until(sock, b"data: first\n\n\r\n")
        assert got.startswith(b"HTTP/1.1 200")
        loop_thread.call(handler.gate.set)  # type: ignore[union-attr]
        got = _read_until(sock, b"\r\n0\r\n\r\n")
        assert b"data: second" in got
