"""One HTTP/1.1 client connection on asyncio.Protocol + httptools: requests run one at a time and are
answered in order (keep-alive, pipelining).

The connection is assembled from parts, each in its own module over the state in connection_state.py:
request_reader.py reads requests (callbacks, caps, pipelining limit), response_writer.py writes answers
(back-pressure, chunked bodies), connection_lifetime.py ends connections (timeouts, protocol errors). This
module runs each request's handler and waits for its answer. A connection over the server's
`max_connections` is answered 503 and closed without reading a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, cast

from .connection_lifetime import ConnectionLifetime
from .connection_state import BODY, ConnectionHost, Refused
from .messages import Deferred, Request, Response
from .request_reader import BUSY, RequestReader
from .response_writer import ResponseWriter

__all__ = ["ConnectionHost", "HttpConnection", "KeepCaseConnection"]

log = logging.getLogger("inferd.http")

_CANCELLED = Response(400, b'{"error":"request cancelled"}')
_INTERNAL = Response(500, b'{"error":"Internal Server Error"}')


class HttpConnection(RequestReader, ResponseWriter, ConnectionLifetime):
    """One client connection: parses requests and writes their responses in order."""

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

    # ---- request handling ----
    def _dispatch(self, item: Request | Refused) -> None:
        while True:
            self._busy = True
            result: Any
            if type(item) is Refused:
                req, result = item.req, item.res
            else:
                req = item  # type: ignore[assignment]  # not a Refused: a Request
                try:
                    result = self._handler(req)
                except Exception:
                    log.exception("HTTP handler failed")
                    result = _INTERNAL
            if not isinstance(result, Response):
                if isinstance(result, Deferred):
                    self._pending = future = result.future
                    self._pending_req = req
                    self._pending_deferred = result
                    done = self._deferred_done
                    future.add_done_callback(done)
                    if hasattr(future, "eager"):  # a scheduler's request: answered, it runs `done` at once
                        future.eager = done
                else:
                    self._task = self._loop.create_task(self._run(req, result))
                return
            if not self._finish(req, result):
                return
            item = self._queue.popleft()

    async def _run(self, req: Request, pending: Awaitable[Response]) -> None:
        try:
            res = await pending
            if getattr(res, "chunks", None) is not None:  # generate_stream (http_api.generate), OpenAI streams
                # in this task: a dropped connection cancels it; kept alive, the next request runs after it
                if await self._write_chunks(req, res) and self._next():
                    self._dispatch(self._queue.popleft())
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

    def _deferred_done(self, future: asyncio.Future[Any]) -> None:
        """The Deferred of the running request is done: build its response and write it."""
        if future is not self._pending or self.closed:
            return  # abandoned (the connection failed or closed)
        req, deferred = self._pending_req, self._pending_deferred
        assert req is not None and deferred is not None
        self._pending = self._pending_req = self._pending_deferred = None
        if future.cancelled():
            res = _CANCELLED
        else:
            try:
                res = deferred.finish(deferred.context, future)
            except Exception:
                log.exception("HTTP handler failed")
                res = _INTERNAL
        if self._paused_writing:
            self._task = self._loop.create_task(self._write_when_ready(req, res))
        elif self._finish(req, res):
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
        return self._next()

    def _next(self) -> bool:
        """An answer was written and the connection stays open: True when a queued request should run now."""
        self._busy = False
        if self._paused_reading and len(self._queue) <= self._max_pipelined // 2 and not self._paused_writing:
            self._resume_reading()
        if self._queue:
            return True
        self.since = time.monotonic()
        if self._expect and self.state == BODY:
            self._send_continue()
        return False


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
