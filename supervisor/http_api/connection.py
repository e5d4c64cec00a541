"""One HTTP/1.1 client connection on asyncio.Protocol + httptools: what lives as long as the socket does.

A connection reads requests (request_reader.py, the class it is built on: the parser, its callbacks and
the caps) and runs them one at a time, each in a RequestCycle (request_cycle.py: the handler, its answer
written, its cancellation), answering in the order they came (keep-alive, pipelining). This module holds
the rest: the socket's events, the requests waiting behind the running one (beyond `max_pipelined`, one is
answered 503 in its turn without running), flow control both ways, timeouts, protocol errors answered
before closing, and close. A connection over the server's `max_connections` is answered 503 and closed
without reading a request.

One request, followed: data_received and on_message_complete (request_reader.py) -> `_complete` (run now,
or queue) -> `_dispatch` -> RequestCycle.start -> its answer written -> `_next` -> the next queued request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol, cast

from .request_cycle import CONTINUE, Request, RequestCycle, Response, error_bytes
from .request_reader import BODY, DRAIN, HEADERS, IDLE, RequestReader

if TYPE_CHECKING:
    from .request_cycle import Coalescer, Handler

__all__ = ["ConnectionHost", "HttpConnection", "KeepCaseConnection"]

BUSY = 503  # too many requests pipelined on one connection, or too many connections
LINGER_S = 2.0  # how long a connection answered with a fatal error keeps draining input
_new_cycle = object.__new__


class ConnectionHost(Protocol):
    """What a connection reads from the server that accepted it (server.py's HttpServer)."""

    handler: Handler
    loop: asyncio.AbstractEventLoop
    coalescer: Coalescer
    max_body: int
    max_pipelined: int
    max_connections: int
    max_header_size: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    closing: bool
    connections: set[Any]

    def _admit(self, conn: Any) -> bool: ...
    def _forget(self, conn: Any) -> None: ...


class Refused:
    """A pipelined request beyond the connection's limit: answered with `res` in its turn, never run."""

    __slots__ = ("req", "res")

    def __init__(self, req: Request, res: Response) -> None:
        self.req = req
        self.res = res


class HttpConnection(RequestReader):
    """One client connection: reads requests and runs them one at a time, answering in order."""

    def __init__(self, server: ConnectionHost) -> None:
        super().__init__(server.max_body, server.max_header_size, server.max_headers)
        self._server = server
        self._handler = server.handler
        self._loop = server.loop
        self._coalescer = server.coalescer
        self._transport: asyncio.Transport | None = None
        self._max_pipelined = server.max_pipelined
        # the request running (its cycle), and those read and waiting (or the 503s owed to those beyond
        # max_pipelined)
        self._cycle: RequestCycle | None = None
        self._queue: deque[Request | Refused] = deque()
        self._paused_reading = False
        self._paused_writing = False
        self._write_ready: asyncio.Future[None] | None = None  # set when the client's socket drains
        self._eof = False
        self.closed = False
        self.admitted = False  # counted in the server's open connections (HttpServer._admit)

    @property
    def _busy(self) -> bool:
        """A request is running (fuzz/targets/http1_request.py's harness reads it)."""
        return self._cycle is not None

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._server.connections.add(self)
        if not self._server._admit(self):
            self._fatal(BUSY, f"too many connections: the server takes at most {self._server.max_connections}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._transport is not None:
            self._coalescer.drop(self._transport)
        self._server._forget(self)
        if self._cycle is not None:
            self._cycle.cancel()  # client went away: cancel the request it was waiting on
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._queue.clear()
        self._body = None  # a body cut off mid-way goes now (the parser and this protocol form a cycle)

    def eof_received(self) -> bool:
        # A client that shuts down its side is treated as gone (as most servers do): the transport
        # closes and connection_lost cancels the request it was waiting on.
        self._eof = True
        return False

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None
        if len(self._queue) < self._max_pipelined:
            self._resume_reading()

    # ---- pipelining: one request runs, the others wait in order ----
    def _complete(self, req: Request) -> None:
        """A request was read: run it now, or queue it behind the one running."""
        if self._cycle is not None:
            if len(self._queue) >= self._max_pipelined:  # not run: answered 503 in its turn
                self._queue.append(self._too_many(req))
            else:
                self._queue.append(req)
            if len(self._queue) >= self._max_pipelined:
                self._pause_reading()
        else:
            self._dispatch(req)

    def _too_many(self, req: Request) -> Refused:
        return Refused(req, Response(BUSY, ('{"error":"too many requests pipelined on this connection: at most %d '
                                            'wait behind the one running"}' % self._max_pipelined).encode()))

    def _dispatch(self, item: Request | Refused) -> None:
        """Run `item` in a cycle of its own; then, while answers are written at once, the requests queued
        behind it (a loop: a long pipeline does not recurse)."""
        while True:
            cycle = _new_cycle(RequestCycle)  # (its fields set here and in start: a frame less per request)
            cycle.conn = self
            self._cycle = cycle
            if type(item) is Refused:
                cycle.req = item.req
                if not cycle.respond(item.res):
                    return
            else:
                cycle.req = item  # type: ignore[assignment]  # not a Refused: a Request
                if not cycle.start():
                    return
            item = self._queue.popleft()

    def _next(self) -> bool:
        """The running request's answer was written and the connection stays open: True when a queued
        request should run now."""
        self._cycle = None
        if self._paused_reading and len(self._queue) <= self._max_pipelined // 2 and not self._paused_writing:
            self._resume_reading()
        if self._queue:
            return True
        self.since = monotonic()
        if self._expect and self.state == BODY:
            self._send_continue()
        return False

    # ---- flow control ----
    def _pause_reading(self) -> None:
        if not self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = False
            self._transport.resume_reading()

    def _send_continue(self) -> None:
        self._expect = False
        if self._transport is not None and not self.closed:
            self._coalescer.release(self._transport)
            self._transport.write(CONTINUE)

    # ---- how a connection ends ----
    @property
    def idle(self) -> bool:
        return self.state == IDLE and self._cycle is None and not self._queue

    def close(self) -> None:
        if not self.closed and self._transport is not None:
            self.closed = True
            self._coalescer.release(self._transport)
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self.closed = True
            self._coalescer.drop(self._transport)
            self._transport.abort()

    def _fatal(self, status: int, message: str) -> None:
        """Answer a protocol-level error, stop parsing, and close once the client is done sending."""
        if self.closed or self._transport is None:
            return
        self.state = DRAIN
        self.since = monotonic()
        self._queue.clear()
        self._body = None  # what was read of a refused body goes at once, not when the connection does
        if self._cycle is not None:
            self._cycle.cancel()
            self._cycle = None
        transport = self._transport
        self._coalescer.release(transport)
        if status:
            transport.write(error_bytes(status, message))
        try:
            if transport.can_write_eof():
                transport.write_eof()  # half-close: the client reads the answer, its sends still drain
        except (OSError, RuntimeError):
            pass
        self._resume_reading()

    def check_timeouts(self, now: float) -> None:
        """The per-connection half of the timeouts (the server's sweeper calls it): slow headers, a body
        without progress, idle keep-alive, and how long a refused connection drains."""
        srv = self._server
        state = self.state
        if state == IDLE:
            if self._cycle is None and not self._queue and now - self.since > srv.keepalive_timeout:
                self.close()
        elif state == HEADERS:
            if now - self.since > srv.header_timeout:
                self._timeout()
        elif state == BODY:
            # since the last progress (the head, body bytes: request_reader), not the last read: a client that
            # keeps sending chunk framing or trailer bytes without finishing is cut off too
            if now - self.since > srv.body_timeout and not (self._expect and (self._cycle is not None or self._queue)):
                self._timeout()
        elif state == DRAIN and now - self.since > min(LINGER_S, srv.body_timeout):
            self.abort()

    def _timeout(self) -> None:
        if self._cycle is not None or self._queue:
            self.abort()  # an earlier response is still pending: do not write out of order
        else:
            self._fatal(408, "request timeout")
            self.abort()


class KeepCaseConnection(HttpConnection):
    """An HttpConnection that also hands the handler every header as received, names in the client's
    spelling (Request.raw_headers): Triton forwards header names as sent (--http-header-forward-pattern).
    A subclass, so that servers without a forward pattern pay nothing per header."""

    _learns = False  # every request goes through the parser, which gathers the raw headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._raw = []

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if self.state != BODY:  # (trailer fields are not the request's headers)
            self._raw.append((name.decode("latin-1"), value.decode("latin-1")))  # type: ignore[union-attr]
