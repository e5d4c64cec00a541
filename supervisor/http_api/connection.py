"""One HTTP/1.1 client connection on asyncio.Protocol + httptools.

Keep-alive, pipelined requests answered in order (one handler at a time per connection; beyond
`max_pipelined` waiting, the next are answered 503 without running), Content-Length and chunked
bodies, `Expect: 100-continue`, header and body caps checked before buffering (a chunked body is
refused the moment it crosses the cap), write back-pressure, and the per-connection half of the
timeouts (the server's sweeper calls `check_timeouts`). A connection over the server's
`max_connections` is answered 503 and closed without reading a request.

The body cap (--http-max-input-size) applies as Triton applies it: to the JSON of a request, and
separately to the bytes after it, so a binary request may be its `Inference-Header-Content-Length`
(at most the cap) plus the cap.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, cast

import httptools

from .messages import Deferred, Request, Response
from .response_bytes import CONTINUE, chunked_head, error_bytes, response_head

if TYPE_CHECKING:
    from .coalesce import Coalescer
    from .messages import Handler


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
    connections: set[HttpConnection]

    def _admit(self, conn: HttpConnection) -> bool: ...
    def _forget(self, conn: HttpConnection) -> None: ...

log = logging.getLogger("inferd.http")

# connection states
_IDLE = 0  # between requests
_HEADERS = 1  # request line / headers being read
_BODY = 2  # body being read
_DRAIN = 3  # an error was answered; incoming bytes are discarded until the client closes

_LINGER_S = 2.0  # how long a connection answered with a fatal error keeps draining input
# ... and how much of it at most: the body cap plus this (a client that sends a body just over the cap
# before reading still gets the 413), then the connection is dropped
_DRAIN_EXTRA = 16 * 1024 * 1024


# raw header name -> its lower-cased str: one dict lookup per request instead of decoding each time
# (bounded: clients choose the names)
_HEADER_NAMES: dict[bytes, str] = {}
_CACHE_MAX = 256
_CANCELLED = Response(400, b'{"error":"request cancelled"}')
_BUSY = 503  # too many requests pipelined on one connection, or too many connections
_INTERNAL = Response(500, b'{"error":"Internal Server Error"}')


class _Refused:
    """A pipelined request beyond the connection's limit: answered with `res` in its turn, never run."""

    __slots__ = ("req", "res")

    def __init__(self, req: Request, res: Response) -> None:
        self.req = req
        self.res = res


class _Abort(Exception):
    """Raised inside a parser callback to stop parsing and answer `status`, then close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and writes their responses in order."""

    def __init__(self, server: ConnectionHost) -> None:
        self._server = server
        self._handler = server.handler
        self._loop = server.loop
        self._coalescer = server.coalescer
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self.state = _IDLE
        self.since = time.monotonic()  # start of the current state (idle / headers) or last read
        self.last_read = self.since
        # request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._raw: list[tuple[str, str]] | None = None  # headers as received (KeepCaseConnection)
        self._hbytes = 0
        self._hraw = 0
        self._completed = 0
        self._clen = -1
        self._cap = server.max_body  # of the request being read (its JSON header adds to it)
        self._body: Any = None
        self._blen = 0
        self._expect = False
        self._max_pipelined = server.max_pipelined
        # requests parsed and waiting (or the 503s owed to those beyond max_pipelined), and the one running
        self._queue: deque[Request | _Refused] = deque()
        self._busy = False
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[Any] | None = None  # the Deferred future the running request waits on
        self._paused_reading = False
        self._paused_writing = False
        self._write_ready: asyncio.Future[None] | None = None
        self._eof = False
        self._drained = 0  # bytes read and dropped after a fatal error
        self.closed = False
        self.admitted = False  # counted in the server's open connections (HttpServer._admit)

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._server.connections.add(self)
        if not self._server._admit(self):
            self._fatal(_BUSY, f"too many connections: the server takes at most {self._server.max_connections}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._transport is not None:
            self._coalescer.drop(self._transport)
        self._server._forget(self)
        if self._task is not None:
            self._task.cancel()  # client went away: cancel the request it was waiting on
        if self._pending is not None:
            self._pending.cancel()
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

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == _DRAIN:
            self._drained += len(data)
            if self._drained > self._server.max_body + _DRAIN_EXTRA:
                self.abort()
            return
        if self._coalescer.held:
            self._coalescer.flush()  # answers first, then the request just read
        self.last_read = time.monotonic()
        completed = self._completed
        try:
            self._parser.feed_data(data)
        except _Abort as exc:
            self._fatal(exc.status, exc.message)
            return
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrade is not supported")
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Abort):
                self._fatal(cause.status, cause.message)
            else:
                log.warning("HTTP parser callback failed: %r", cause)
                self._fatal(500, "Internal Server Error")
            return
        except httptools.HttpParserError as exc:
            self._fatal(400, f"malformed HTTP request: {str(exc) or type(exc).__name__}")
            return
        if self.state == _HEADERS and self._completed == completed:
            # every byte of this read belongs to unfinished headers: bound what httptools buffers
            self._hraw += len(data)
            if self._hraw > self._server.max_header_size:
                self._fatal(431, "request header too large")

    # ---- httptools callbacks ----
    def on_message_begin(self) -> None:
        self.state = _HEADERS
        self.since = time.monotonic()
        self._url = b""
        self._headers = {}
        self._hbytes = 0
        self._hraw = 0
        self._clen = -1
        self._body = None
        self._blen = 0
        self._expect = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._hbytes += len(url)
        if self._hbytes > self._server.max_header_size:
            raise _Abort(414, "request URI too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._hbytes += len(name) + len(value) + 4
        if self._hbytes > self._server.max_header_size or len(self._headers) >= self._server.max_headers:
            raise _Abort(431, "request header too large")
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _CACHE_MAX:
                _HEADER_NAMES[name] = key
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.state = _BODY
        headers = self._headers
        cap = self._server.max_body
        hlen = headers.get("inference-header-content-length")
        if hlen is not None and hlen.isascii() and hlen.isdigit() and len(hlen) < 19 and int(hlen) <= cap:
            cap += int(hlen)  # the JSON header is capped on its own, as Triton caps it (codec checks it)
        self._cap = cap
        clen = headers.get("content-length")
        if clen is not None:
            # llhttp has validated the digits; refuse before reading a byte of the body
            n = int(clen)
            if n > cap:
                raise _Abort(413, f"request body of {n} bytes exceeds the maximum allowed {cap} bytes")
            self._clen = n
        expect = headers.get("expect")
        if expect is not None:
            if expect.lower() != "100-continue":
                raise _Abort(417, "unsupported Expect header")
            if self._clen != 0:
                self._expect = True
                if not self._busy and not self._queue:
                    self._send_continue()

    def on_body(self, body: bytes) -> None:
        if self._body is None and len(body) == self._clen:
            self._body = body  # the whole body in one read: keep the bytes object as it is
            self._blen = len(body)
            return
        n = self._blen + len(body)
        if n > self._cap:  # a chunked body: refused the moment it crosses the cap
            raise _Abort(413, f"request body exceeds the maximum allowed {self._cap} bytes")
        if self._body is None:
            self._body = bytearray(self._clen) if self._clen > 0 else bytearray()
        if self._clen > 0:
            self._body[self._blen:n] = body
        else:
            self._body += body
        self._blen = n

    def on_message_complete(self) -> None:
        self._completed += 1
        parser = self._parser
        url = self._url
        path, _, query = url.partition(b"?")
        body = self._body
        if body is None:
            body = b""
        elif self._blen != len(body):
            body = memoryview(body)[: self._blen]
        req = Request(parser.get_method().decode("latin-1"), path.decode("latin-1"),
                      query.decode("latin-1"), self._headers, body, parser.should_keep_alive(), self._raw)
        self._body = None
        self._expect = False
        self.state = _IDLE
        self.since = time.monotonic()
        if self._busy:
            if len(self._queue) >= self._max_pipelined:  # not run: answered 503 in its turn
                self._queue.append(self._too_many(req))
            else:
                self._queue.append(req)
            if len(self._queue) >= self._max_pipelined:
                self._pause_reading()
        else:
            self._dispatch(req)

    def _too_many(self, req: Request) -> _Refused:
        return _Refused(req, Response(_BUSY, ('{"error":"too many requests pipelined on this connection: at most %d '
                                              'wait behind the one running"}' % self._max_pipelined).encode()))

    # ---- request handling ----
    def _dispatch(self, item: Request | _Refused) -> None:
        while True:
            self._busy = True
            result: Any
            if type(item) is _Refused:
                req, result = item.req, item.res
            else:
                req = item  # type: ignore[assignment]  # not a _Refused: a Request
                try:
                    result = self._handler(req)
                except Exception:
                    log.exception("HTTP handler failed")
                    result = _INTERNAL
            if not isinstance(result, Response):
                if isinstance(result, Deferred):
                    self._pending = future = result.future
                    future.add_done_callback(functools.partial(self._deferred_done, req, result.finish))
                else:
                    self._task = self._loop.create_task(self._run(req, result))
                return
            if not self._finish(req, result):
                return
            item = self._queue.popleft()

    async def _run(self, req: Request, pending: Awaitable[Response]) -> None:
        try:
            res = await pending
            if getattr(res, "chunks", None) is not None:  # generate_stream (http_api.generate)
                await self._write_chunks(res)  # in this task: a dropped connection cancels it
                return
        except asyncio.CancelledError:
            if self.closed:
                return
            res = _CANCELLED
        except Exception:
            log.exception("HTTP handler failed")
            res = _INTERNAL
        self._task = None
        if self.closed:
            return
        if self._paused_writing:
            await self._write_when_ready(req, res)
        elif self._finish(req, res):
            self._dispatch(self._queue.popleft())

    def _deferred_done(self, req: Request, finish: Any, future: asyncio.Future[Any]) -> None:
        """The Deferred of the running request is done: build its response and write it."""
        if future is not self._pending or self.closed:
            return  # abandoned (the connection failed or closed)
        self._pending = None
        if future.cancelled():
            res = _CANCELLED
        else:
            try:
                res = finish(future)
            except Exception:
                log.exception("HTTP handler failed")
                res = _INTERNAL
        if self._paused_writing:
            self._task = self._loop.create_task(self._write_when_ready(req, res))
        elif self._finish(req, res):
            self._dispatch(self._queue.popleft())

    async def _write_when_ready(self, req: Request, res: Response) -> None:
        """The client is not reading: wait for the transport to drain before writing more."""
        self._write_ready = self._loop.create_future()
        await self._write_ready
        self._task = None
        if self.closed:
            return
        if self._finish(req, res):
            self._dispatch(self._queue.popleft())

    def _finish(self, req: Request, res: Response) -> bool:
        """Write `res`; True when another queued request should run now."""
        self._busy = False
        transport = self._transport
        if transport is None or self.closed:
            return False
        keep = req.keep_alive and not self._server.closing and not self._eof
        self._write(transport, res, keep, req.headers.get("connection"))
        if not keep:
            self.close()
            return False
        if self._paused_reading and len(self._queue) <= self._max_pipelined // 2 and not self._paused_writing:
            self._resume_reading()
        if self._queue:
            return True
        self.since = time.monotonic()
        if self._expect and self.state == _BODY:
            self._send_continue()
        return False

    def _write(self, transport: asyncio.Transport, res: Response, keep: bool, conn_hdr: str | None) -> None:
        body: Any = res.body
        if type(body) is bytes:
            single, size = True, len(body)
        else:
            single = isinstance(body, (bytearray, memoryview))
            size = memoryview(body).nbytes if single else sum(memoryview(b).nbytes for b in body)
        head = response_head(res, size, keep, conn_hdr)
        if size <= 65536:
            # one small write: joining is cheaper than handing several buffers to the transport
            if single:
                head.append(body)
            else:
                head.extend(body)
            self._coalescer.write(transport, b"".join(head))
            return
        self._coalescer.release(transport)
        if single:
            transport.write(b"".join(head))
            transport.write(body)
        else:
            transport.write(b"".join(head))
            for part in body:
                transport.write(part)

    async def _write_chunks(self, res: Any) -> None:
        """A body produced while it is written (`res.chunks`, an async iterator of bytes): chunked
        transfer encoding, waiting while the client does not read; the connection closes after it."""
        # stays _busy (the idle sweeper leaves it alone); requests pipelined behind a stream are not
        # answered: it ends by closing the connection
        self._queue.clear()
        transport = self._transport
        assert transport is not None
        chunks = res.chunks
        self._coalescer.release(transport)
        try:
            transport.write(chunked_head(res.status, res.content_type))
            async for chunk in chunks:
                if self.closed:
                    return
                if chunk:  # an empty chunk would end the body
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if self._paused_writing:
                    self._write_ready = self._loop.create_future()
                    await self._write_ready
            if not self.closed:
                transport.write(b"0\r\n\r\n")
        finally:
            await chunks.aclose()
            self._task = None
            self.close()

    def _send_continue(self) -> None:
        self._expect = False
        if self._transport is not None and not self.closed:
            self._coalescer.release(self._transport)
            self._transport.write(CONTINUE)

    def _fatal(self, status: int, message: str) -> None:
        """Answer a protocol-level error, stop parsing, and close once the client is done sending."""
        if self.closed or self._transport is None:
            return
        self.state = _DRAIN
        self.since = time.monotonic()
        self._queue.clear()
        self._body = None  # what was read of a refused body goes at once, not when the connection does
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._busy = False
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

    def _pause_reading(self) -> None:
        if not self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = False
            self._transport.resume_reading()

    # ---- used by the server ----
    @property
    def idle(self) -> bool:
        return self.state == _IDLE and not self._busy and not self._queue

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

    def check_timeouts(self, now: float) -> None:
        srv = self._server
        state = self.state
        if state == _IDLE:
            if not self._busy and not self._queue and now - self.since > srv.keepalive_timeout:
                self.close()
        elif state == _HEADERS:
            if now - self.since > srv.header_timeout:
                self._timeout()
        elif state == _BODY:
            if now - self.last_read > srv.body_timeout and not (self._expect and (self._busy or self._queue)):
                self._timeout()
        elif state == _DRAIN and now - self.since > min(_LINGER_S, srv.body_timeout):
            self.abort()

    def _timeout(self) -> None:
        if self._busy or self._queue:
            self.abort()  # an earlier response is still pending: do not write out of order
        else:
            self._fatal(408, "request timeout")
            self.abort()


class KeepCaseConnection(HttpConnection):
    """An HttpConnection that also hands the handler every header as received, names in the client's
    spelling (Request.raw_headers): Triton forwards header names as sent (--http-header-forward-pattern).
    A subclass, so that servers without a forward pattern pay nothing per header."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._raw = []

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._raw.append((name.decode("latin-1"), value.decode("latin-1")))  # type: ignore[union-attr]
