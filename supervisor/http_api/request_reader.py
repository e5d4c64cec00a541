"""The reading half of an HTTP/1.1 connection (connection.py's HttpConnection is a RequestReader): bytes in,
each request read handed on in the order it came. httptools' callbacks, the header and body caps checked
before anything is buffered (a chunked body is refused the moment it crosses the cap), `Expect:
100-continue`. Bytes that make no progress (an unfinished head, chunk framing, trailer fields) are capped
together as a head is; trailer fields never become headers; `Upgrade:` is ignored as Triton ignores it
(`_upgrade`); bytes after a request without keep-alive are dropped.

A request with both `Content-Length` and `Transfer-Encoding: chunked` is read as chunked, as Triton reads it
(RFC 9112 6.3: Transfer-Encoding overrides Content-Length), and the connection is closed once it is answered
(6.3 again: what follows such a request is not trusted, so it is dropped). Any other Transfer-Encoding beside
a Content-Length (`gzip`, `xchunked`, ...) is refused with 400, as are duplicate Content-Lengths (llhttp).

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

import asyncio
import logging
from time import monotonic
from typing import TYPE_CHECKING, Any

import httptools

from .request_cycle import Request

if TYPE_CHECKING:
    from collections import deque

    from .request_cycle import Coalescer

log = logging.getLogger("inferd.http")

# what the connection is reading (`state`)
IDLE = 0  # between requests
HEADERS = 1  # request line / headers being read
BODY = 2  # body being read
DRAIN = 3  # an error was answered; incoming bytes are discarded until the client closes
CLOSING = 4  # the connection's last request was read (no keep-alive, or CONNECT): what follows is dropped

# how much a connection answered with a fatal error drains at most: the body cap plus this (a client
# that sends a body just over the cap before reading still gets the 413), then it is dropped
DRAIN_EXTRA = 16 * 1024 * 1024

# raw header name -> its lower-cased str: one dict lookup per request instead of decoding each time
# (bounded: clients choose the names)
_HEADER_NAMES: dict[bytes, str] = {}
_TARGETS: dict[bytes, tuple[str, str]] = {}  # request target -> (path, query), the same way
_CACHE_MAX = 256
# method bytes -> str (llhttp accepts only the methods it knows: a few dozen at most)
_METHODS = {m: m.decode() for m in (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH")}
_new_request = object.__new__
HEAD_MAX = 1024  # longest head kept for reading again (one per connection)


def new_parser(protocol: object) -> httptools.HttpRequestParser:
    """A request parser that reads a chunked body beside a Content-Length (on_headers_complete checks the rest)."""
    parser = httptools.HttpRequestParser(protocol)
    lenient = getattr(parser, "set_dangerous_leniencies", None)  # (httptools >= 0.6.2; older ones refuse CL+TE)
    if lenient is not None:
        lenient(lenient_chunked_length=True)
    return parser


class _Dropped(Exception):
    """Raised at the start of a request parsed after the connection's last one (see `_CHUNKED_OVER_LENGTH`):
    parsing stops and the rest is dropped, as after a request without keep-alive."""


# _clen of a chunked request that also had a Content-Length: the body is read as chunked and the connection
# closes after the answer (llhttp reads it so with lenient_chunked_length; its other checks stay)
_CHUNKED_OVER_LENGTH = -2


class Abort(Exception):
    """Raised inside a parser callback to stop parsing and answer `status`, then close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RequestReader(asyncio.Protocol):
    """asyncio's data_received and httptools' callbacks: bytes in, each Request read handed to `_complete`
    (connection.py: run now or queued behind the one running). What the request being read has so far (its
    target, headers, body) lives here until it is complete: the callbacks run per header and per body
    piece, so they read and write plain attributes."""

    def __init__(self, max_body: int, max_header_size: int, max_headers: int) -> None:
        self._parser = new_parser(self)
        self.state = IDLE
        self.since = monotonic()  # start of the current state (idle / headers) or of the last progress
        self.last_read = self.since
        self._max_body = max_body
        self._max_header_size = max_header_size
        self._max_headers = max_headers
        # the request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._raw: list[tuple[str, str]] | None = None  # headers as received (KeepCaseConnection)
        self._hbytes = 0
        self._hraw = 0  # bytes read since the last progress (a head, body bytes): capped as a head is
        self._completed = 0
        self._clen = -1
        self._cap = max_body  # of the request being read (its JSON header adds to it)
        self._body: Any = None
        self._blen = 0
        self._expect = False
        # the last request's head, when it can be read again without the parser (the module's docstring)
        self._head: bytes | None = None
        self._head_parsed: tuple[str, str, str, dict[str, str], int] | None = None
        self._read: bytes | None = None  # the read being parsed, when it began at a request's start
        # a request that asked for Upgrade (or CONNECT) while its body is read (_after_upgrade)
        self._held: tuple[bytes, bool, bytes, dict[str, str], list[tuple[str, str]] | None] | None = None
        self._drained = 0  # bytes read and dropped after a fatal error

    if TYPE_CHECKING:  # the connection's (connection.py), which the reader asks
        _coalescer: Coalescer
        _queue: deque[Any]
        _cycle: Any  # the request running, or None

        def _complete(self, req: Request) -> None: ...
        def _fatal(self, status: int, message: str) -> None: ...
        def _send_continue(self) -> None: ...
        def abort(self) -> None: ...

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state >= DRAIN:  # an error was answered, or the last request was read: dropped, bounded
            self._drained += len(data)
            if self._drained > self._max_body + DRAIN_EXTRA:
                self.abort()
            return
        if self._coalescer.waiting:
            self._coalescer.flush()  # answers first, then the request just read
        self.last_read = monotonic()
        if state == IDLE:
            head = self._head
            if (head is not None and data.startswith(head)
                    and len(data) - len(head) == self._head_parsed[4]):  # type: ignore[index]
                self._again(data, len(head))
                return
            self._read = data  # (a head to keep, if it is one request: on_message_complete)
        else:
            self._read = None
        completed = self._completed
        blen = self._blen
        try:
            at = -1
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                at = exc.args[0]
            if at >= 0:  # parsed on outside the except block: a callback error raised there has its own context
                self._upgrade(data, at)  # (inside, it carried the upgrade, and an Abort became a 500)
        except Abort as exc:
            self._fatal(exc.status, exc.message)
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Dropped):
                return
            if isinstance(cause, Abort):
                self._fatal(cause.status, cause.message)
            else:
                log.warning("HTTP parser callback failed: %r", cause)
                self._fatal(500, "Internal Server Error")
            return
        except httptools.HttpParserError as exc:
            if self.state != CLOSING:  # (bytes after the last request: dropped, not an error to answer)
                self._fatal(400, f"malformed HTTP request: {str(exc) or type(exc).__name__}")
            return
        # Bytes that made no progress (no request completed, no body byte read) are what httptools buffers
        # or skips: an unfinished head, a chunk-size line or extension, trailer fields. They are capped
        # together as a head is (--http max header size), so one endless line cannot grow the buffer.
        new = self.state
        if new == HEADERS:
            if self._completed == completed:
                self._hraw += len(data)
                if self._hraw > self._max_header_size:
                    self._fatal(431, "request header too large")
        elif new == BODY:
            if state == BODY and self._completed == completed and self._blen == blen:
                self._hraw += len(data)
                if self._hraw > self._max_header_size:
                    self._fatal(431, "request trailers or chunk framing too large: more than "
                                     f"{self._max_header_size} bytes without body data")
            else:  # progress: the body timeout counts from here (a client that only sends framing is cut off)
                self._hraw = 0
                self.since = self.last_read

    def _upgrade(self, data: bytes | memoryview, at: int) -> None:
        """Go on parsing after a request that asked for a protocol upgrade (`Upgrade` with `Connection:
        upgrade`, or CONNECT); `at`: where its head ended in `data`.

        Triton ignores Upgrade: the request is an ordinary one, its body included, and the connection stays
        HTTP/1.1. llhttp instead completes such a request at the end of its head with no body (httptools
        tells it to skip the body) and stops; httptools raises HttpParserUpgrade with the offset where it
        stopped. Answering there gave an infer request an empty body and parsed its body as the next request
        (a second, unsolicited answer). So on_message_complete holds the request back, and here a new parser
        is fed a head of our own that declares the held request's framing (its Content-Length, or chunked),
        then the rest of the bytes: llhttp reads the body and everything pipelined after it as it would have
        without the upgrade, and on_message_complete answers the held request (its method, target, headers
        and keep-alive) with that body. A CONNECT is answered without a body and ends the connection: what
        follows it is a tunnel's bytes, not HTTP (Triton answers 404 to one, as the routes do)."""
        while True:
            rest = self._after_upgrade(data, at)
            if not rest:
                return
            try:
                self._parser.feed_data(rest)
                return
            except httptools.HttpParserUpgrade as exc:  # a pipelined request asked for one too
                data, at = rest, exc.args[0]

    def _after_upgrade(self, data: bytes | memoryview, at: int) -> bytes | memoryview:
        """Feed the head standing in for the held request's; the bytes still to parse."""
        held = self._held
        assert held is not None
        method, keep, _, headers, _ = held
        self._read = None
        hbytes, expect = self._hbytes, self._expect
        rest: bytes | memoryview
        if method == b"CONNECT":
            self._held = (method, False, *held[2:])
            head = b"POST / HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            rest = b""
        else:
            framing = (b"Transfer-Encoding: chunked\r\n" if "transfer-encoding" in headers
                       else b"Content-Length: %d\r\n" % max(self._clen, 0))
            hlen = headers.get("inference-header-content-length")
            if hlen is not None and hlen.isascii() and hlen.isdigit():  # the same body cap (on_headers_complete)
                framing += b"Inference-Header-Content-Length: %s\r\n" % hlen.encode()
            head = b"POST / HTTP/1.1\r\n%s%s\r\n" % (b"" if keep else b"Connection: close\r\n", framing)
            rest = memoryview(data)[at:]
        # a fresh parser: the one that stopped may refuse what follows (an upgrade without keep-alive)
        self._parser = new_parser(self)
        self._parser.feed_data(head)  # (a request without a body is answered here)
        if self.state == BODY:  # its body follows: the held head's size (trailers add to it) and Expect
            self._hbytes, self._expect = hbytes, expect
        return rest

    # ---- httptools callbacks ----
    def on_message_begin(self) -> None:
        if self.state == CLOSING:  # llhttp read on after a request the connection ends with
            raise _Dropped
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
        if self.state == BODY:
            return  # a trailer field: counted against the cap, never merged (RFC 9110 6.5.1; Triton ignores them)
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _CACHE_MAX:
                _HEADER_NAMES[name] = key
        headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.state = BODY
        headers = self._headers
        cap = self._max_body
        hlen = headers.get("inference-header-content-length")
        if hlen is not None and hlen.isascii() and hlen.isdigit() and len(hlen) < 19 and int(hlen) <= cap:
            cap += int(hlen)  # the JSON header is capped on its own, as Triton caps it (codec checks it)
        self._cap = cap
        clen = headers.get("content-length")
        if clen is not None and "transfer-encoding" in headers:
            # RFC 9112 6.3: chunked wins, then close; any other coding is a framing no one can agree on
            if headers["transfer-encoding"].strip().lower() != "chunked":
                raise Abort(400, "malformed HTTP request: Content-Length with a Transfer-Encoding other than "
                                 f"chunked ({headers['transfer-encoding']!r})")
            self._clen = _CHUNKED_OVER_LENGTH
        elif clen is not None:
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
                if self._cycle is None and not self._queue:
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
        parser = self._parser
        held = self._held
        if held is None:
            method = parser.get_method()
            keep = parser.should_keep_alive() and self._clen != _CHUNKED_OVER_LENGTH
            # (llhttp upgrades only on an Upgrade header or CONNECT: the cheap test first)
            if (method == b"CONNECT" or "upgrade" in self._headers) and parser.should_upgrade():
                self._held = (method, keep, self._url, self._headers, self._raw)  # answered with its body: _upgrade
                return
        else:  # the request held at its upgrade, with the body read after it
            self._held = None
            method, keep, self._url, self._headers, self._raw = held
        self._completed += 1
        url = self._url
        target = _TARGETS.get(url)
        if target is None:
            target = self._target()
            if len(_TARGETS) < _CACHE_MAX and len(url) <= 256:
                _TARGETS[url] = target
        method_name = _METHODS.get(method) or method.decode("latin-1")
        read, self._read = self._read, None
        if read is not None and self._learns:
            self._keep_head(read, method_name, target)
        elif self._head is not None and not keep:
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
        req.keep_alive = keep
        req.raw_headers = self._raw
        self._body = None
        self._expect = False
        # the parser refuses bytes after a request without keep-alive: they are dropped (RFC 9112 9.6), not
        # answered with an error in place of this request's answer
        self.state = IDLE if keep else CLOSING
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
