"""The HTTP/2 connection's lifetime (http2/connection.py `Lifetime`): keepalive PINGs and the maximum
connection age, driven frame by frame from a raw socket (_h2client.H2Client) against an H2Connection
whose application is a stub that records streams and answers them when the test says so.

The server runs on an event loop in a thread of this process; nothing here imports generated protos.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from inferd.supervisor.grpc_api.http2 import frames as f
from inferd.supervisor.grpc_api.http2 import lifetime as h2lifetime
from inferd.supervisor.grpc_api.http2.connection import H2Connection
from inferd.supervisor.grpc_api.http2.hpack_codec import encode
from inferd.supervisor.grpc_api.http2.lifetime import Lifetime

from ._h2client import SERVICE, H2Client, request_headers

_OK = encode([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")])


class _Handler:
    def __init__(self) -> None:
        self.reset = threading.Event()

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        pass

    def on_reset(self) -> None:
        self.reset.set()


class _App:
    """Records connections and streams; never answers by itself."""

    def __init__(self) -> None:
        self.connections: list[H2Connection] = []
        self.streams: dict[int, _Handler] = {}
        self.lost = threading.Event()

    def connection_made(self, conn: H2Connection) -> None:
        self.connections.append(conn)

    def connection_lost(self, conn: H2Connection) -> None:
        self.lost.set()

    def open_stream(self, conn: H2Connection, stream_id: int, headers: Any, end_stream: bool) -> _Handler:
        handler = self.streams[stream_id] = _Handler()
        return handler


class _Server:
    def __init__(self, lifetime: Lifetime) -> None:
        self.app = _App()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        make = self.loop.create_server(lambda: H2Connection(self.app, lifetime), "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(make, self.loop).result(30)
        self.url = "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` on the server's loop and returns its result."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the test thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return done.result(30)

    def answer(self, sid: int) -> None:
        """The application answers stream `sid` (a Trailers-Only response)."""
        conn = self.app.connections[0]
        self.call(lambda: conn.send_headers(sid, _OK, end_stream=True))

    def wait_stream(self, sid: int) -> _Handler:
        deadline = time.monotonic() + 30
        while sid not in self.app.streams:
            assert time.monotonic() < deadline, f"stream {sid} never reached the application"
            time.sleep(0.01)
        return self.app.streams[sid]

    def close(self) -> None:
        def shut() -> None:  # on the loop's thread: asyncio's Server is not thread-safe
            self.server.close()
            for conn in self.app.connections:
                conn.abort()

        self.call(shut)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture()
def serve() -> Iterator[Callable[[Lifetime], _Server]]:
    started: list[_Server] = []

    def start(lifetime: Lifetime) -> _Server:
        server = _Server(lifetime)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def _open(h2: H2Client) -> int:
    sid = h2.new_stream()
    h2.send(h2.headers(sid, request_headers(SERVICE + "ServerLive")))
    return sid


# ---- keepalive ----
def test_keepalive_pings_a_quiet_client_and_drops_one_that_does_not_answer(serve) -> None:
    server = serve(Lifetime(ping_interval=0.2, ping_timeout=0.5, ping_idle=True))
    h2 = H2Client(server.url).start()
    try:
        ping = h2.wait_for(f.PING)
        assert not ping.flags & f.ACK and len(ping.payload) == 8
        h2.send(f.ping_ack(ping.payload))
        again = h2.wait_for(f.PING)  # answered: the next interval brings the next PING
        assert again.payload == ping.payload
        started = time.monotonic()
        h2.read_until_closed()  # not answered: dropped after the timeout
        assert time.monotonic() - started >= 0.4
    finally:
        h2.close()


def test_keepalive_leaves_an_idle_connection_alone_unless_permitted(serve) -> None:
    server = serve(Lifetime(ping_interval=0.1, ping_timeout=30))
    h2 = H2Client(server.url).start()
    try:
        h2.sock.settimeout(0.5)  # five intervals without a call: no PING
        with pytest.raises(TimeoutError):
            h2.wait_for(f.PING)
        h2.sock.settimeout(60)
        _open(h2)  # a call running: the client is pinged
        assert not h2.wait_for(f.PING).flags & f.ACK
    finally:
        h2.close()


# ---- maximum connection age ----
def test_max_age_goaway_in_two_steps_running_calls_finish(serve) -> None:
    server = serve(Lifetime(max_age=0.2))
    h2 = H2Client(server.url).start()
    try:
        first = _open(h2)
        server.wait_stream(first)
        goaway = h2.wait_for(f.GOAWAY)  # the first GOAWAY: "no new streams after the highest one"
        assert f.u32(goaway.payload) == f.MAX_STREAM_ID and f.u32(goaway.payload[4:]) == f.NO_ERROR
        ping = h2.wait_for(f.PING)
        crossing = _open(h2)  # opened before the client read the GOAWAY: still served
        server.wait_stream(crossing)
        h2.send(f.ping_ack(ping.payload))
        final = h2.wait_for(f.GOAWAY)  # names the last stream the client opened
        assert f.u32(final.payload) == crossing and f.u32(final.payload[4:]) == f.NO_ERROR
        late = _open(h2)
        assert f.u32(h2.wait_for(f.RST_STREAM, late).payload) == f.REFUSED_STREAM
        server.answer(first)
        assert h2.response(first).status == 0
        server.answer(crossing)  # the last running call is done: the connection closes
        assert h2.response(crossing).status == 0
        h2.read_until_closed()
        assert not server.app.streams[first].reset.is_set()
    finally:
        h2.close()


def test_max_age_grace_closes_the_connection_under_running_calls(serve) -> None:
    server = serve(Lifetime(max_age=0.1, max_age_grace=0.4))
    h2 = H2Client(server.url).start()
    try:
        sid = _open(h2)
        handler = server.wait_stream(sid)
        h2.send(f.ping_ack(h2.wait_for(f.PING).payload))
        assert f.u32(h2.wait_for(f.GOAWAY).payload) == f.MAX_STREAM_ID
        assert f.u32(h2.wait_for(f.GOAWAY).payload) == sid
        h2.read_until_closed()  # the call never finished: closed after the grace period
        assert handler.reset.wait(10)  # and the call was told
    finally:
        h2.close()


def test_max_age_final_goaway_without_the_clients_ping_ack(serve, monkeypatch) -> None:
    monkeypatch.setattr(h2lifetime, "RETIRE_ACK_WAIT_S", 0.2)
    server = serve(Lifetime(max_age=0.1))
    h2 = H2Client(server.url).start()
    try:
        h2.wait_for(f.PING)  # never answered
        assert f.u32(h2.wait_for(f.GOAWAY).payload) == f.MAX_STREAM_ID
        assert f.u32(h2.wait_for(f.GOAWAY).payload) == 0  # no stream was opened
        h2.read_until_closed()  # nothing running: closed at once
    finally:
        h2.close()
