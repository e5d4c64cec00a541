"""Reading HTTP/1.1 requests off a connection: httptools' callbacks, the header and body caps checked
before anything is buffered (a chunked body is refused the moment it crosses the cap), `Expect:
100-continue`, and the pipelining limit (beyond `max_pipelined` waiting, a request is answered 503 in its
turn without running).

The body cap (--http-max-input-size) applies as Triton applies it: to the JSON of a request, and
separately to the bytes after it, so a binary request may be its `Inference-Header-Content-Length`
(at most the cap) plus the cap.

A client sends the same head again and again (a closed loop of one request per connection: wrk,
perf_analyzer, tritonclient), so each connection keeps the head of its last request when that request
came as one whole read: the head bytes, as httptools parsed them, with a Content-Length body, keep-alive
and nothing that changes how it is read (no Expect, Transfer-Encoding or Upgrade). A later read that is
exactly those head bytes and a body of that length becomes its Request without the parser: the same
bytes at a request's start parse the same way, and the caps were checked when they were parsed.
"""

from __future__ import annotations

import logging
import time

import httptools

from .connection_state import BODY, DRAIN, HEADERS, IDLE, ConnectionState, Refused
from .messages import Request, Response

log = logging.getLogger("inferd.http")

# how much a connection answered with a fatal error drains at most: the body cap plus this (a client
# that sends a body just over the cap before reading still gets the 413), then it is dropped
DRAIN_EXTRA = 16 * 1024 * 1024
BUSY = 503  # too many requests pipelined on one connection, or too many connections

# raw header name -> its lower-cased str: one dict lookup per request instead of decoding each time
# (bounded: clients choose the names)
_HEADER_NAMES: dict[bytes, str] = {}
_TARGETS: dict[bytes, tuple[str, str]] = {}  # request target -> (path, query), the same way
_CACHE_MAX = 256
# method bytes -> str (llhttp accepts only the methods it knows: a few dozen at most)
_METHODS = {m: m.decode() for m in (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH")}
_new_request = object.__new__
HEAD_MAX = 1024  # longest head kept for reading again (one per connection)


class Abort(Exception):
    """Raised inside a parser callback to stop parsing and answer `status`, then close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RequestReader(ConnectionState):
    """asyncio's data_received and httptools' callbacks: bytes in, Requests to `_dispatch` (or queued)."""

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == DRAIN:
            self._drained += len(data)
            if self._drained > self._server.max_body + DRAIN_EXTRA:
                self.abort()
            return
        if self._coalescer.waiting:
            self._coalescer.flush()  # answers first, then the request just read
        self.last_read = time.monotonic()
        if self.state == IDLE:
            head = self._head
            if (head is not None and data.startswith(head)
                    and len(data) - len(head) == self._head_parsed[4]):  # type: ignore[index]
                self._again(data, len(head))
                return
            self._read = data  # (a head to keep, if it is one request: on_message_complete)
        else:
            self._read = None
        completed = self._completed
        try:
            self._parser.feed_data(data)
        except Abort as exc:
            self._fatal(exc.status, exc.message)
            return
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrade is not supported")
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, Abort):
                self._fatal(cause.status, cause.message)
            else:
                log.warning("HTTP parser callback failed: %r", cause)
                self._fatal(500, "Internal Server Error")
            return
        except httptools.HttpParserError as exc:
            self._fatal(400, f"malformed HTTP request: {str(exc) or type(exc).__name__}")
            return
        if self.state == HEADERS and self._completed == completed:
            # every byte of this read belongs to unfinished headers: bound what httptools buffers
            self._hraw += len(data)
            if self._hraw > self._server.max_header_size:
                self._fatal(431, "request header too large")

    # ---- httptools callbacks ----
    def on_message_begin(self) -> None:
        self.state = HEADERS
        self.since = self.last_read  # the read that began it
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
        if self._hbytes > self._max_header_size:
            raise Abort(414, "request URI too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        hbytes = self._hbytes + len(name) + len(value) + 4
        headers = self._headers
        if hbytes > self._max_header_size or len(headers) >= self._max_headers:
            raise Abort(431, "request header too large")
        self._hbytes = hbytes
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _CACHE_MAX:
                _HEADER_NAMES[name] = key
        headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.state = BODY
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
                raise Abort(413, f"request body of {n} bytes exceeds the maximum allowed {cap} bytes")
            self._clen = n
        expect = headers.get("expect")
        if expect is not None:
            if expect.lower() != "100-continue":
                raise Abort(417, "unsupported Expect header")
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
            raise Abort(413, f"request body exceeds the maximum allowed {self._cap} bytes")
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
        target = _TARGETS.get(url)
        if target is None:
            target = self._target()
            if len(_TARGETS) < _CACHE_MAX and len(url) <= 256:
                _TARGETS[url] = target
        method = parser.get_method()
        method_name = _METHODS.get(method) or method.decode("latin-1")
        read, self._read = self._read, None
        if read is not None and self._learns:
            self._keep_head(read, method_name, target)
        elif self._head is not None and not parser.should_keep_alive():
            self._head = None
        body = self._body
        if body is None:
            body = b""
        elif self._blen != len(body):
            body = memoryview(body)[: self._blen]
        req = _new_request(Request)  # Request's fields set here: a frame less per request than Request(...)
        req.method = method_name
        req.path, req.query = target
        req.headers = self._headers
        req.body = body
        req.keep_alive = parser.should_keep_alive()
        req.raw_headers = self._raw
        self._body = None
        self._expect = False
        self.state = IDLE
        self.since = self.last_read
        self._complete(req)

    _learns = True  # (KeepCaseConnection: its raw headers come from the parser)

    def _keep_head(self, read: bytes, method: str, target: tuple[str, str]) -> None:
        """`read` began at this request's start: keep the request's head (its `method` and `target` as
        on_message_complete read them) if the read was all of it and it may be read again without the
        parser (see the module's docstring). Else the head kept before stays, unless this request ends the
        connection (no keep-alive: the parser refuses what follows)."""
        parser = self._parser
        if not parser.should_keep_alive():
            self._head = None
            return
        blen = self._blen
        end = len(read) - blen
        headers = self._headers
        if (self._clen != blen or end > HEAD_MAX
                or read.find(b"\r\n\r\n") != end - 4 or read.count(b"\n", 0, end) != read.count(b"\r\n", 0, end)
                or "expect" in headers or "transfer-encoding" in headers or "upgrade" in headers):
            return
        self._head = read[:end]
        self._head_parsed = (method, *target, headers.copy(), blen)

    def _again(self, data: bytes, start: int) -> None:
        """A request whose head is the one kept (`_keep_head`) and its body, read without the parser."""
        self._completed += 1
        self.since = self.last_read
        method, path, query, headers, blen = self._head_parsed  # type: ignore[misc]
        req = _new_request(Request)
        req.method = method
        req.path = path
        req.query = query
        req.headers = headers.copy()  # (the handler's own: one request's changes stay its own)
        req.body = data[start:] if blen else b""
        req.keep_alive = True
        req.raw_headers = None
        self._complete(req)

    def _target(self) -> tuple[str, str]:
        path, _, query = self._url.partition(b"?")
        return path.decode("latin-1"), query.decode("latin-1")

    def _complete(self, req: Request) -> None:
        """Run `req` now, or queue it behind the one running."""
        if self._busy:
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
