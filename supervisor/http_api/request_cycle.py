"""One request's run on an HTTP/1.1 connection, from the moment it may run (the requests before it on the
connection are answered) to the last byte of its answer: the handler called, the answer it returns waited
for, the response written, and its cancellation when the connection fails or goes away.

The handler returns a Response (written at once: health, metadata), a Deferred (the usual inference: its
future's done-callback is the cycle itself, no task per request), or an awaitable (run in a task). A
Response whose `chunks` is set (generate_stream, OpenAI streams) is written chunked as it is produced, in
that task. A small answer goes through the coalescer (messages.py); a large one is written buffer by
buffer; an answer waits while the client does not read (back-pressure). The connection (connection.py)
starts one cycle at a time and the next once this one's answer is written (`respond` -> `_next`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from .messages import Deferred, Request, Response, chunked_head, json_ok, response_head

if TYPE_CHECKING:
    from collections import deque

    from .messages import Coalescer, Handler

log = logging.getLogger("inferd.http")

SMALL = 65536  # a response up to this size is joined into one buffer
_CANCELLED = Response(400, b'{"error":"request cancelled"}')
_INTERNAL = Response(500, b'{"error":"Internal Server Error"}')


class Connection(Protocol):
    """What a cycle uses of the connection that runs it (connection.py's HttpConnection)."""

    closed: bool
    _server: Any  # (its `closing`: a shutdown under way ends keep-alive)
    _handler: Handler
    _loop: asyncio.AbstractEventLoop
    _coalescer: Coalescer
    _transport: asyncio.Transport | None
    _cycle: RequestCycle | None
    _queue: deque[Any]
    _paused_writing: bool
    _write_ready: asyncio.Future[None] | None
    _eof: bool

    def _dispatch(self, item: Any) -> None: ...
    def _next(self) -> bool: ...
    def close(self) -> None: ...


class RequestCycle:
    """One request run and answered. Made by HttpConnection._dispatch, which sets `conn` and `req` (no
    __init__: a frame less per request; `start` sets the rest); the connection holds the running one as
    `_cycle`, and a cycle whose connection no longer holds it was abandoned (a protocol error, or the
    client went away)."""

    __slots__ = ("conn", "req", "deferred", "task")

    conn: Connection
    req: Request
    deferred: Deferred | None  # the Deferred the request waits on
    task: asyncio.Task[None] | None  # the task awaiting the handler's awaitable, or waiting to write

    def start(self) -> bool:
        """Call the handler. True when its answer was written at once and the next queued request should
        run now (the connection's `_dispatch` loops: no recursion over a pipeline)."""
        conn = self.conn
        result: Any
        try:
            result = conn._handler(self.req)
        except Exception:
            log.exception("HTTP handler failed")
            result = _INTERNAL
        if isinstance(result, Response):
            return self.respond(result)
        # what the cycle waits on, set once the answer is not at hand: until then nothing can cancel it (the
        # handler ran synchronously), and an answer at hand sets neither
        if isinstance(result, Deferred):
            self.deferred = result
            self.task = None
            future = result.future
            future.add_done_callback(self)  # (the cycle is the callback: `__call__`)
            if hasattr(future, "eager"):  # a scheduler's request: answered, it runs the callback at once
                future.eager = self
        else:
            self.deferred = None
            self.task = conn._loop.create_task(self._run(result))
        return False

    def __call__(self, future: asyncio.Future[Any]) -> None:
        """The Deferred's future is done: build the response and write it."""
        conn = self.conn
        deferred = self.deferred
        if deferred is None or conn._cycle is not self or conn.closed:
            return  # abandoned (the connection failed or closed), or already answered
        self.deferred = None
        if future.cancelled():
            res = _CANCELLED
        else:
            try:
                res = deferred.finish(deferred.context, future)
            except Exception:
                log.exception("HTTP handler failed")
                res = _INTERNAL
        if conn._paused_writing:
            self.task = conn._loop.create_task(self._write_when_ready(res))
        elif self.respond(res):
            conn._dispatch(conn._queue.popleft())

    async def _run(self, pending: Awaitable[Response]) -> None:
        conn = self.conn
        try:
            res = await pending
            if getattr(res, "chunks", None) is not None:  # generate_stream (http_api.generate), OpenAI streams
                # in this task: a dropped connection cancels it; kept alive, the next request runs after it
                if await self._write_chunks(res) and conn._next():
                    conn._dispatch(conn._queue.popleft())
                return
        except asyncio.CancelledError:
            if conn.closed or conn._cycle is not self:
                return  # the connection failed (its error answer is written) or went away: nothing to answer
            res = _CANCELLED
        except Exception:
            log.exception("HTTP handler failed")
            res = _INTERNAL
        self.task = None
        if conn.closed:
            return
        if conn._paused_writing:
            await self._write_when_ready(res)
        elif self.respond(res):
            conn._dispatch(conn._queue.popleft())

    def cancel(self) -> None:
        """The connection failed or went away: stop waiting for the answer (the handler's work is cancelled
        with it)."""
        if self.task is not None:
            self.task.cancel()
        if self.deferred is not None:
            self.deferred.future.cancel()

    # ---- the answer ----
    def respond(self, res: Response) -> bool:
        """Write `res`; True when the connection stays open and a queued request should run now."""
        conn = self.conn
        conn._cycle = None
        transport = conn._transport
        if transport is None or conn.closed:
            return False
        req = self.req
        keep = req.keep_alive and not conn._server.closing and not conn._eof
        body = res.body
        conn_hdr = req.headers.get("connection")
        if (type(body) is bytes and keep and conn_hdr is None and res.status == 200 and res.headers is None
                and body and len(body) <= SMALL and res.content_type == "application/json"):
            conn._coalescer.write(transport, json_ok(body))  # the common answer, its head from a template
        else:
            write(conn._coalescer, transport, res, keep, conn_hdr)
        if not keep:
            conn.close()
            return False
        return conn._next()

    async def _write_when_ready(self, res: Response) -> None:
        """The client is not reading: wait for its socket to drain before writing more."""
        conn = self.conn
        conn._write_ready = conn._loop.create_future()
        await conn._write_ready
        self.task = None
        if conn.closed:
            return
        if self.respond(res):
            conn._dispatch(conn._queue.popleft())

    async def _write_chunks(self, res: Any) -> bool:
        """A body produced while it is written (`res.chunks`, an async iterator of bytes): chunked
        transfer encoding, waiting while the client does not read. True when the body ended and the
        connection stays open for the next request (keep-alive, as Triton's generate_stream and what HTTP
        clients such as httpx expect); otherwise the connection is closed here."""
        # the cycle stays the connection's running one meanwhile (the idle sweeper leaves it alone); requests
        # pipelined behind the stream wait in the queue and are answered after it
        conn = self.conn
        transport = conn._transport
        assert transport is not None
        keep = self.req.keep_alive and not conn._server.closing and not conn._eof
        if not keep:
            conn._queue.clear()
        chunks = res.chunks
        coalescer = conn._coalescer
        # Every chunk goes through the coalescer: the first write of an event-loop pass leaves at once (a lone
        # token waits for nothing); what follows in the same pass (this stream's tokens already queued, other
        # streams' tokens) leaves joined at the pass's end: one send per connection and pass, not per event.
        head: bytes | None = chunked_head(res.status, res.content_type, res.headers, keep)  # leaves with a chunk
        ended = False
        try:
            async for chunk in chunks:
                if conn.closed:
                    return False
                if chunk:  # an empty chunk would end the body
                    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    if head is not None:
                        frame, head = head + frame, None
                    coalescer.write(transport, frame)
                if conn._paused_writing:
                    coalescer.release(transport)
                    conn._write_ready = conn._loop.create_future()
                    await conn._write_ready
            if not conn.closed:
                coalescer.write(transport, b"0\r\n\r\n" if head is None else head + b"0\r\n\r\n")
                ended = True
        finally:
            await chunks.aclose()
            self.task = None
            keep = ended and keep and not conn._server.closing  # (a shutdown that began meanwhile ends it)
            if not keep:
                conn.close()
        return keep and not conn.closed


def write(coalescer: Coalescer, transport: asyncio.Transport, res: Response, keep: bool,
          conn_hdr: str | None) -> None:
    """Write a sized response (but the common one, which `respond` writes from a template): a small one joined
    into one buffer and handed to the coalescer, a large one buffer by buffer. `conn_hdr`: the request's
    Connection header."""
    body: Any = res.body
    if type(body) is bytes:
        single, size = True, len(body)
    else:
        single = isinstance(body, (bytearray, memoryview))
        size = memoryview(body).nbytes if single else sum(memoryview(b).nbytes for b in body)
    head = response_head(res, size, keep, conn_hdr)
    if size <= SMALL:
        # one small write: joining is cheaper than handing several buffers to the transport
        if single:
            head.append(body)
        else:
            head.extend(body)
        coalescer.write(transport, b"".join(head))
        return
    coalescer.release(transport)
    if single:
        transport.write(b"".join(head))
        transport.write(body)
    else:
        transport.write(b"".join(head))
        for part in body:
            transport.write(part)
