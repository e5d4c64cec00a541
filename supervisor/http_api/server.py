"""A small HTTP/1.1 server on asyncio.Protocol + httptools, built for the inference request path.

What it does: keep-alive, pipelined requests answered in order, Content-Length and chunked request
bodies, `Expect: 100-continue`, header and body size caps checked before buffering, header/body read
timeouts (slow-loris), an idle keep-alive timeout, write back-pressure, and a graceful close that lets
in-flight requests finish. The protocol itself lives in connection.py (one per client: its socket, the
requests waiting, timeouts, close), built on request_reader.py (bytes to requests); each request runs in a
request_cycle.py RequestCycle (the handler, its answer written, its cancellation).

The handler is called with a `Request` and returns a `Response`, or an awaitable of one. Returning a
`Response` directly (the synchronous endpoints: health, metadata) skips creating a task.
"""

from __future__ import annotations

import asyncio
import time

from .connection import HttpConnection, KeepCaseConnection
from .request_cycle import Coalescer, Handler, HandlerResult, Request, Response

__all__ = ["Handler", "HandlerResult", "HttpServer", "Request", "Response", "start_http_server"]

MAX_CONNECTIONS = 8192  # --http-max-connections
MAX_PIPELINED = 32  # --http-max-pipelined-requests


class HttpServer:
    """The listening socket, its connections, one timeout sweeper, and a graceful close."""

    def __init__(self, handler: Handler, *, max_body: int, max_header_size: int = 16384,
                 max_headers: int = 100, header_timeout: float = 30.0, body_timeout: float = 30.0,
                 keepalive_timeout: float = 75.0, keep_header_case: bool = False,
                 max_connections: int = MAX_CONNECTIONS, max_pipelined: int = MAX_PIPELINED) -> None:
        """`keep_header_case`: requests carry their headers as received too (Request.raw_headers).
        `max_connections`: open connections beyond it are answered 503 and closed (0: no limit);
        `max_pipelined`: requests waiting behind a running one on a connection, beyond it 503."""
        self.handler = handler
        self.max_body = max_body
        self.max_connections = max_connections
        self.max_pipelined = max(1, max_pipelined)
        self.admitted = 0  # connections open and not refused
        self.max_header_size = max_header_size
        self.max_headers = max_headers
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.keepalive_timeout = keepalive_timeout
        self.connection_class = KeepCaseConnection if keep_header_case else HttpConnection
        self.loop = asyncio.get_running_loop()
        self.coalescer = Coalescer(self.loop)
        self.connections: set[HttpConnection] = set()
        self.closing = False
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._tick = max(0.01, min(1.0, header_timeout / 4, body_timeout / 4, keepalive_timeout / 4))
        self._all_closed: asyncio.Event | None = None
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int, *, backlog: int = 1024, reuse_port: bool = False) -> None:
        connection = self.connection_class
        self._server = await self.loop.create_server(lambda: connection(self), host, port,
                                                     reuse_address=True, reuse_port=reuse_port or None,
                                                     backlog=backlog)
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        self._sweeper = self.loop.call_later(self._tick, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            conn.check_timeouts(now)
        self._sweeper = self.loop.call_later(self._tick, self._sweep)

    def _admit(self, conn: HttpConnection) -> bool:
        if self.max_connections and self.admitted >= self.max_connections:
            return False
        conn.admitted = True
        self.admitted += 1
        return True

    def _forget(self, conn: HttpConnection) -> None:
        if conn.admitted:
            conn.admitted = False
            self.admitted -= 1
        self.connections.discard(conn)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    def close(self) -> None:
        """Stop accepting; close idle connections; busy ones close after their current response."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle:
                conn.close()

    async def wait_closed(self, timeout: float | None = None) -> None:
        """Wait until every connection is gone (aborting what is left after `timeout`)."""
        if not self.closing:
            self.close()
        if self.connections:
            self._all_closed = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_closed.wait(), timeout)
            except asyncio.TimeoutError:
                for conn in list(self.connections):
                    conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            await self._server.wait_closed()


async def start_http_server(handler: Handler, host: str, port: int, *, max_body: int,
                            max_header_size: int = 16384, header_timeout: float = 30.0,
                            body_timeout: float = 30.0, keepalive_timeout: float = 75.0,
                            reuse_port: bool = False, keep_header_case: bool = False,
                            max_connections: int = MAX_CONNECTIONS, max_pipelined: int = MAX_PIPELINED) -> HttpServer:
    """Listen on host:port (port 0 = any free port; read it back from `.port`). `reuse_port`: other
    servers that set it too may listen on the same port (SO_REUSEPORT, --reuse-http-port).
    `keep_header_case`: requests carry their headers as received too (Request.raw_headers)."""
    server = HttpServer(handler, max_body=max_body, max_header_size=max_header_size,
                        header_timeout=header_timeout, body_timeout=body_timeout,
                        keepalive_timeout=keepalive_timeout, keep_header_case=keep_header_case,
                        max_connections=max_connections, max_pipelined=max_pipelined)
    await server.start(host, port, reuse_port=reuse_port)
    return server
