"""Pieces of the HTTP/1.1 target (http1_request.py): an in-memory transport, the reference readings of a
request stream (plain httptools fed it at once, and h11), and a reader of the responses a connection wrote."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import h11
import httptools


class Transport:
    """What an asyncio transport does for a connection, in memory: writes kept, flow control recorded."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.eof = False
        self.paused = False

    def write(self, data: Any) -> None:
        assert not self.eof, "a write after write_eof"
        self.out += data

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Message:
    method: str
    url: bytes
    headers: list[tuple[bytes, bytes]]  # the head's fields, as received
    body: bytes
    keep_alive: bool
    upgrade: bool


@dataclass
class Reading:
    messages: list[Message] = field(default_factory=list)
    begun: int = 0  # messages begun (a partial one at the end counts)
    end: str = "clean"  # "clean", "partial" (inside a message), "error", "connect" (after a CONNECT)
    error: str = ""
    rest: int = 0  # bytes after a CONNECT


class _Closed(Exception):
    """A message begun after one that ends the connection as the server reads it (below)."""


def _parser(ref: Any) -> httptools.HttpRequestParser:
    """llhttp as the server sets it: a chunked body beside a Content-Length is read as chunked (issue 43)."""
    parser = httptools.HttpRequestParser(ref)
    parser.set_dangerous_leniencies(lenient_chunked_length=True)
    return parser


class _Ref:
    """httptools' callbacks gathering each message as it is, nothing capped, nothing cached. As the server:
    a message with both Content-Length and Transfer-Encoding is read as chunked if that is its only coding
    (RFC 9112 6.3), refused otherwise, and ends the connection (what follows is dropped: end "closed")."""

    def __init__(self) -> None:
        self.r = Reading()
        self.parser = _parser(self)
        self.close_after = False  # the message being read ends the connection
        self.closed = False
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.in_head = False
        self.held: Message | None = None  # a message that asked to upgrade, its body still to read

    def on_message_begin(self) -> None:
        if self.closed:
            raise _Closed
        self.close_after = False
        self.r.begun += 1
        self.url, self.headers, self.body, self.in_head = b"", [], bytearray(), True

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:  # (trailer fields come here too, after the head: not the request's headers)
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        names = {k.lower(): v for k, v in self.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            if names[b"transfer-encoding"].strip().lower() != b"chunked":
                raise ValueError("Content-Length with a Transfer-Encoding other than chunked")
            self.close_after = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        p = self.parser
        held, self.held = self.held, None
        if held is not None:  # the body of the message held at its upgrade, read by a head of our own
            held.body = bytes(self.body)
            self.r.messages.append(held)
            return
        self.r.messages.append(Message(p.get_method().decode("latin-1"), self.url, self.headers, bytes(self.body),
                                       p.should_keep_alive() and not self.close_after, p.should_upgrade()))
        self.closed = self.close_after and not p.should_upgrade()  # (an upgrade's body is read after it first)


def _stand_in(m: Message) -> bytes:
    """A head that frames a body as `m`'s head does, for reading it after llhttp stopped at `m`'s upgrade."""
    names = {k.lower(): v for k, v in m.headers}
    if b"transfer-encoding" in names:
        framing = b"Transfer-Encoding: chunked\r\n"
    else:
        framing = b"Content-Length: %d\r\n" % int(names.get(b"content-length", b"0").strip() or b"0")
    return b"POST / HTTP/1.1\r\n%s%s\r\n" % (b"" if m.keep_alive else b"Connection: close\r\n", framing)


def httptools_reading(stream: bytes) -> Reading:
    """The messages of `stream` as plain httptools reads them fed at once, with Upgrade ignored as Triton
    ignores it: llhttp ends a message that asks to upgrade at its head and stops; here its body is read
    by its own framing and parsing goes on. A CONNECT ends the stream (a tunnel's bytes follow)."""
    ref = _Ref()
    r = ref.r
    data = stream
    while True:
        try:
            ref.parser.feed_data(data)
            r.end = "clean" if r.begun == len(r.messages) and ref.held is None else "partial"
            return r
        except httptools.HttpParserUpgrade as exc:
            if r.begun != len(r.messages) or not r.messages:
                r.end = "error"
                return r
            at = int(exc.args[0])
            m = r.messages[-1]
            if m.method == "CONNECT":
                m.keep_alive = False
                r.end, r.rest = "connect", len(data) - at
                return r
            r.messages.pop()
            r.begun -= 1
            ref.parser = _parser(ref)
            ref.held = None
            try:
                ref.parser.feed_data(_stand_in(m))
            except httptools.HttpParserError as exc2:  # (the head is ours: cannot happen)
                raise AssertionError(f"the stand-in head for {m!r} is refused: {exc2}") from None
            if r.begun > len(r.messages):  # a body follows: the message completes once it is read
                ref.held = m
            else:
                r.messages[-1] = m
            data = data[at:]
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Closed):
                r.end = "closed"  # (the bytes after a message that ends the connection: dropped)
                return r
            r.end, r.error = "error", str(exc)
            return r


def h11_reading(stream: bytes) -> list[tuple[str, bytes, bytes]]:
    """(method, target, body) of each request h11 reads in `stream`, answering each (200, empty) to go on;
    it stops at its first refusal, at a request that ends the connection, or where the bytes run out."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(stream)
    out: list[tuple[str, bytes, bytes]] = []
    cur: list[Any] = []
    try:
        while True:
            ev = conn.next_event()
            if isinstance(ev, h11.Request):
                cur = [ev.method.decode("latin-1"), bytes(ev.target), bytearray()]
            elif isinstance(ev, h11.Data):
                cur[2] += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                out.append((cur[0], cur[1], bytes(cur[2])))
                conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return out
                conn.start_next_cycle()
            else:  # NEED_DATA, PAUSED, ConnectionClosed
                return out
    except h11.ProtocolError:
        return out


@dataclass
class Answer:
    status: int
    body: bytes
    close: bool


def responses(out: bytes) -> tuple[list[Answer], int, str]:
    """The final responses in what a connection wrote, how many interim (1xx) ones, and what is left over
    unread ("" when it all reads as whole responses)."""

    class Cb:
        def __init__(self) -> None:
            self.done: list[Answer] = []
            self.interim = 0
            self.body = bytearray()
            self.close = False

        def on_message_begin(self) -> None:
            self.body = bytearray()
            self.close = False

        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"connection" and value.lower() == b"close":
                self.close = True

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            status = parser.get_status_code()
            if 100 <= status < 200:
                self.interim += 1
            else:
                self.done.append(Answer(status, bytes(self.body), self.close))

    cb = Cb()
    # a 1xx response is followed by more: llhttp reads each as its own message (no body)
    parser = httptools.HttpResponseParser(cb)
    try:
        parser.feed_data(out)
    except httptools.HttpParserError as exc:
        return cb.done, cb.interim, f"unreadable response bytes: {exc}"
    return cb.done, cb.interim, ""
