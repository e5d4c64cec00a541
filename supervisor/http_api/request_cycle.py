"""One HTTP/1.1 request's exchange, from what the client sent to the last byte of its answer.

- What passes between a connection and its handlers: the Request, the Response (or the Deferred answer of
  an inference), and the bytes of a response (status lines, the head of a sized or chunked response, the
  short JSON error a connection answers before closing).
- The RequestCycle: one request's run, from the moment it may run (the requests before it on the
  connection are answered): the handler called, the answer it returns waited for, the response written,
  and its cancellation when the connection fails or goes away. The handler returns a Response (written at
  once: health, metadata), a Deferred (the usual inference: its future's done-callback is the cycle itself,
  no task per request), or an awaitable (run in a task). A Response whose `chunks` is set (generate_stream,
  OpenAI streams) is written chunked as it is produced, in that task. A large answer is written buffer by
  buffer; an answer waits while the client does not read (back-pressure). The connection (connection.py)
  starts one cycle at a time and the next once this one's answer is written (`respond` -> `_next`).
- The Coalescer, through which a small answer goes: the second and later small responses of an event-loop
  pass leave together at its end. A batch's results answer many connections in one pass; each write to a
  client whose thread sleeps on another, idle CPU wakes that CPU, and on a virtual machine the writer pays
  for the wake-up inside the send call (more than half of its cost here). Written back to back at the end
  of the pass, the responses find the client still awake reading the previous one. The first answer of a
  pass leaves at once: a lone answer (one client, one request) waits for nothing. A flush scheduled with
  call_soon runs on the loop's next pass, after the I/O callbacks of that pass; so a connection that reads
  a request first writes out what is held (`flush`, when `held`), and no request is parsed while answers
  wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol, Union


class Request:
    """One parsed request. Header names are lower-cased; `body` is bytes-like. `raw_headers` holds every
    header as received (names as the client spelled them, repeats included) when the server keeps them
    (HttpServer keep_header_case, for --http-header-forward-pattern), else None."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "raw_headers")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: Any,
                 keep_alive: bool, raw_headers: list[tuple[str, str]] | None = None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.raw_headers = raw_headers


class Response:
    """Status, body (bytes, or a sequence of buffers written without joining) and headers."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int = 200, body: bytes | Sequence[Any] = b"",
                 content_type: str | None = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class Deferred:
    """A response that `finish(context, future)` builds once `future` is done. The connection waits for it
    with a done-callback instead of running a task per request (cheaper); cancelling `future` abandons it."""

    __slots__ = ("future", "finish", "context")

    def __init__(self, future: asyncio.Future[Any], finish: Callable[[Any, asyncio.Future[Any]], Response],
                 context: Any = None) -> None:
        self.future = future
        self.finish = finish
        self.context = context


HandlerResult = Union[Response, Deferred, Awaitable[Response]]
Handler = Callable[[Request], HandlerResult]


# ---- the bytes of a response ----

def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# content type -> its header line: one dict lookup per response (bounded: handlers choose the types)
_CONTENT_TYPES: dict[str, bytes] = {}
_CACHE_MAX = 256


def error_bytes(status: int, message: str) -> bytes:
    body = ('{{"error":"{}"}}'.format(message.replace("\\", "\\\\").replace('"', '\\"'))).encode()
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: ",
        str(len(body)).encode(), b"\r\n\r\n", body,
    ))


def response_head(res: Any, size: int, keep: bool, conn_hdr: str | None) -> list[bytes]:
    """Status line and headers of a response with a `size`-byte body, ending with the blank line."""
    head = [STATUS_LINES.get(res.status) or _status_line(res.status)]
    ctype = res.content_type
    if ctype is not None and size:
        line = _CONTENT_TYPES.get(ctype)
        if line is None:
            line = b"Content-Type: %s\r\n" % ctype.encode("latin-1")
            if len(_CONTENT_TYPES) < _CACHE_MAX:
                _CONTENT_TYPES[ctype] = line
        head.append(line)
    if res.headers:
        for k, v in res.headers.items():
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
    if not keep:
        head.append(b"Connection: close\r\n")
    elif conn_hdr is not None and conn_hdr.lower() == "keep-alive":
        head.append(b"Connection: keep-alive\r\n")  # HTTP/1.0 clients asking for keep-alive
    head.append(b"Content-Length: %d\r\n\r\n" % size)
    return head


_JSON_OK = STATUS_LINES[200] + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


def json_ok(body: bytes) -> bytes:
    """A whole 200 response with a non-empty JSON body on a kept-alive connection whose client did not
    send `Connection` (the common answer): the bytes response_head and the body make, in one step."""
    return _JSON_OK % (len(body), body)


def chunked_head(status: int, content_type: str | None, headers: dict[str, str] | None = None,
                 keep: bool = False) -> bytes:
    """The head of a body written as it is produced (chunked); `keep`: the connection stays open after it."""
    extra = [f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()] if headers else []
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: %s\r\n" % (content_type or "application/octet-stream").encode("latin-1"),
        *extra,
        b"Cache-Control: no-cache\r\n",
        b"" if keep else b"Connection: close\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n"))


# ---- small answers of one pass leave together ----

class Coalescer:
    """Writes the first small answer of a pass at once and holds the following ones, per transport,
    until the pass is over. Any other write to, or close of, a transport must `release` it first, so
    its bytes keep their order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.waiting: dict[asyncio.Transport, list[bytes]] = {}  # answers held, per transport
        self._in_pass = False  # an answer has been written in this pass: hold the next ones

    @property
    def held(self) -> bool:
        return bool(self.waiting)

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        if not self._in_pass:
            self._in_pass = True
            self._loop.call_soon(self.flush)
            transport.write(data)
            return
        held = self.waiting
        parts = held.get(transport)
        if parts is None:
            held[transport] = [data]
        else:
            parts.append(data)

    def release(self, transport: asyncio.Transport) -> None:
        """Write what is held for `transport` now."""
        parts = self.waiting.pop(transport, None)
        if parts and not transport.is_closing():
            transport.write(b"".join(parts))

    def drop(self, transport: asyncio.Transport) -> None:
        """Forget what is held for `transport` (aborted or lost)."""
        self.waiting.pop(transport, None)

    def flush(self) -> None:
        self._in_pass = False
        held, self.waiting = self.waiting, {}
        for transport, parts in held.items():
            if not transport.is_closing():
                transport.write(parts[0] if len(parts) == 1 else b"".join(parts))


# ---- one request's run ----

if TYPE_CHECKING:
    from collections import deque

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
