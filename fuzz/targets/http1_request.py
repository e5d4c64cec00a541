"""The HTTP/1.1 request path (supervisor/http_api: request_reader.py and the connection around it) against
httptools fed the same bytes plainly, and h11.

Input: two option bytes, up to 15 read sizes (u16 little-endian each, cycled over the stream), then the
bytes a client sends on one connection:

    byte 0: bits 0-1 handler (0 answers at once, 1 a Deferred answered on the loop's next pass, 2 an
            awaitable done on the next pass, 3 the three in turn), bit 2 keep header case, bit 3 small caps
            (256-byte heads, 1 KiB bodies), bit 4 run the loop between reads, bit 5 the client half-closes
            after its last read, bits 6-7 max pipelined (1, 2, 4, 32)
    byte 1: bits 0-3 how many read sizes follow, bit 4 the client stops reading answers for a while (write
            back-pressure), bit 5 large answers (not joined into one write), bit 6 measure what the connection
            holds (tracemalloc: an input takes about 3 times as long)

The stream reaches the connection through data_received in those reads, as asyncio hands them on, over an
in-memory transport; the handler answers each request with its number. Invariants:
- nothing unexpected is raised or logged (a callback failure answered 500 is a finding);
- the i-th request handed on is the i-th message httptools reads in the stream at once (Upgrade ignored as
  Triton ignores it, a CONNECT ending the stream: _http1.httptools_reading): the same method, target, head
  fields (lower-cased, last wins; trailer fields are not the request's headers), body and keep-alive; and
  the same (method, target, body) as h11 where h11 reads that message too (its first 4 KiB; up to a
  CONNECT, whose body, if any, means nothing);
- no request is handed on that httptools does not read (no extra message, nothing read differently);
- responses come back in order, one per request (or a 503 for one beyond the pipelining cap), plus at most
  one error answer, written last, and only where there is something to refuse: bytes httptools refuses or
  has not finished reading, or a request over a cap. Nothing follows an answer that closes the connection;
- reading is never left paused with nothing in flight;
- what the connection holds once everything is answered stays within its caps and one read (with byte 1
  bit 6, measured with tracemalloc).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import tracemalloc
from typing import Any

import uvloop
from _http1 import Transport, h11_reading, httptools_reading, responses
from inferd.supervisor.http_api.request_cycle import Deferred, Request, Response
from inferd.supervisor.http_api.server import HttpServer

INSTRUMENT = ("inferd.supervisor.http_api",)
MAX_LEN = 32768
DICT = [b"\r\n", b"\r\n\r\n", b"GET ", b"POST ", b"HEAD ", b"PUT ", b"CONNECT ", b"OPTIONS ", b" HTTP/1.1\r\n",
        b" HTTP/1.0\r\n", b"Host: h\r\n", b"Content-Length: ", b"Transfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: ", b"Connection: close\r\n", b"Connection: keep-alive\r\n", b"Connection: upgrade\r\n",
        b"Upgrade: h2c\r\n", b"Upgrade: websocket\r\n", b"Expect: 100-continue\r\n",
        b"Inference-Header-Content-Length: ",
        b"Content-Encoding: gzip\r\n", b"Trailer: X\r\n", b"0\r\n\r\n", b"0\r\nX-T: 1\r\n\r\n", b";ext=1", b"\r\n0\r\n",
        b"/v2/models/m/infer", b"/v2/health/ready", b"?a=1", b"ffffffff\r\n", b"\t", b" ", b":"]

SMALL = {"max_body": 1024, "max_header_size": 256, "max_headers": 8}
DEFAULT = {"max_body": 1 << 20, "max_header_size": 16384, "max_headers": 100}
PIPELINED = (1, 2, 4, 32)
H11_BYTES = 4096  # h11 (pure Python) reads this much of the stream: the messages in it are compared
IDLE_HELD = 12 * 1024  # what a connection holds with no request in it, and slack (measured: ~5 KiB)

_loop: asyncio.AbstractEventLoop | None = None
_logged: list[logging.LogRecord] = []


class _Catch(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _logged.append(record)


def setup() -> None:
    global _loop
    _loop = uvloop.new_event_loop()
    logger = logging.getLogger("inferd.http")
    logger.addHandler(_Catch(logging.WARNING))
    logger.propagate = False


class Run:
    """One connection fed one stream; what it handed on and wrote."""

    def __init__(self, flags: int, flags2: int) -> None:
        self.mode = flags & 3
        self.keep_case = bool(flags & 4)
        self.caps = SMALL if flags & 8 else DEFAULT
        self.interleave = bool(flags & 16)
        self.half_close = bool(flags & 32)
        self.pipelined = PIPELINED[flags >> 6]
        self.backpressure = bool(flags2 & 16)
        self.large = bool(flags2 & 32)
        self.measure = bool(flags2 & 64)
        self.handed: list[Request] = []
        self.held = 0

    def handler(self, req: Request) -> Any:
        n = len(self.handed)
        req.body = bytes(req.body)  # (a view of the connection's buffer: kept as it was handed on)
        self.handed.append(req)
        body: Any = b'{"n":%d}' % n
        if self.large and n % 2:
            body = [b'{"n":%d,"pad":"' % n, b"x" * 70000, b'"}']
        res = Response(200, body)
        mode = self.mode if self.mode != 3 else n % 3
        if mode == 0:
            return res
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(lambda: fut.done() or fut.set_result(res))  # (cancelled if the connection failed)
        if mode == 1:
            return Deferred(fut, lambda ctx, f: f.result())
        return fut  # an awaitable: the connection awaits it in a task

    async def settle(self, server: HttpServer, conn: Any) -> None:
        """Let the loop run the answers (a Deferred's on the next pass, a coroutine's a pass or two later)."""
        for _ in range(8):
            await asyncio.sleep(0)
            if not conn._busy and not conn._queue and not server.coalescer.waiting:
                break
        server.coalescer.flush()

    async def feed(self, reads: list[bytes]) -> tuple[Transport, bool]:
        server = HttpServer(self.handler, max_pipelined=self.pipelined, keep_header_case=self.keep_case,
                            **self.caps)  # type: ignore[arg-type]
        if self.measure:
            tracemalloc.start(1)  # (what is allocated from here on is traced: the connection's buffers)
        try:
            conn = server.connection_class(server)
            transport = Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            for data in reads:
                if transport.closed:
                    break
                if transport.paused:
                    await self.settle(server, conn)
                    if transport.paused:
                        break
                if self.backpressure:
                    conn.pause_writing()
                conn.data_received(data)
                if self.interleave or self.backpressure:
                    await self.settle(server, conn)
                if self.backpressure:
                    conn.resume_writing()
                    await self.settle(server, conn)
            if self.half_close and not transport.closed:
                conn.eof_received()
                transport.closed = True
            await self.settle(server, conn)
            stalled = transport.paused and not transport.closed and conn.idle
            # what the connection holds now, everything answered: what dropping it frees (the parser and the
            # connection refer to each other; that cycle is cut by hand, not left to the collector)
            held_with = tracemalloc.get_traced_memory()[0]
            conn.connection_lost(None)
            conn._parser = None  # type: ignore[assignment]
            del conn
            self.held = held_with - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()  # (a no-op when not tracing)
        return transport, stalled


def split(stream: bytes, sizes: list[int]) -> list[bytes]:
    if not sizes:
        return [stream] if stream else []
    out = []
    pos = i = 0
    while pos < len(stream):
        n = sizes[i % len(sizes)]
        out.append(stream[pos:pos + n])
        pos += n
        i += 1
    return out


def _headers(fields: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in fields}


def test_one_input(data: bytes) -> None:
    flags = data[0] if data else 0
    flags2 = data[1] if len(data) > 1 else 0
    nsizes = flags2 & 15
    sizes = [max(1, s) for (s,) in struct.iter_unpack("<H", data[2:2 + 2 * nsizes].ljust(2 * nsizes, b"\0"))]
    stream = data[2 + 2 * nsizes:]
    run = Run(flags, flags2)
    _logged.clear()
    assert _loop is not None
    reads = split(stream, sizes)
    transport, stalled = _loop.run_until_complete(run.feed(reads))
    assert not _logged, f"logged: {[r.getMessage() for r in _logged]}"
    assert not stalled, "reading stays paused with nothing in flight"
    ref = httptools_reading(stream)
    handed = run.handed

    # answers: in order, one per request, at most one error answer, last
    answers, _interim, leftover = responses(bytes(transport.out))
    assert not leftover, leftover
    n = refused = 0
    fatal = None
    for i, a in enumerate(answers):
        assert fatal is None, f"answer {i} ({a.status}) written after the error answer {fatal.status}"
        assert a.status != 500, f"answered 500: {a.body[:200]!r}"
        if a.status == 200:
            assert a.body.startswith(b'{"n":%d' % n), f"answer {i} is {a.body[:40]!r}, request {n} expected"
            n += 1
        elif a.status == 503 and b"pipelined" in a.body:
            refused += 1
        else:
            fatal = a
        if a.close and fatal is None and i != len(answers) - 1:
            raise AssertionError(f"answer {i} closes the connection, yet {len(answers) - i - 1} more follow")
    assert n <= len(handed), f"{n} answers for {len(handed)} requests handed on"

    # each request handed on is the message httptools reads (refused ones are skipped in the count)
    parsed = len(handed) + refused
    assert parsed <= len(ref.messages), (
        f"{parsed} requests read where httptools reads {len(ref.messages)} ({ref.end} {ref.error})")
    pos = 0  # the stream position of each handed request: its answer's, counting refusals before it
    k = 0
    order = []
    for a in answers:
        if a.status == 200:
            order.append(pos)
            pos += 1
        elif a.status == 503 and b"pipelined" in a.body:
            pos += 1
    if not refused:
        order = list(range(len(handed)))
    for k, req in enumerate(handed[:len(order)]):
        m = ref.messages[order[k]]
        path, _, query = m.url.partition(b"?")
        got = (req.method, req.path, req.query, dict(req.headers), bytes(req.body), req.keep_alive)
        want = (m.method, path.decode("latin-1"), query.decode("latin-1"), _headers(m.headers), m.body, m.keep_alive)
        assert got == want, f"request {k} handed on as\n  {got!r:.600}\nhttptools reads\n  {want!r:.600}"
        if run.keep_case:
            raw = [(a.decode("latin-1"), b.decode("latin-1")) for a, b in m.headers]
            assert req.raw_headers == raw, f"request {k} raw headers {req.raw_headers!r:.300} != {raw!r:.300}"
    h11_msgs = h11_reading(stream[:H11_BYTES])
    for i, (m, h) in enumerate(zip(ref.messages, h11_msgs)):
        if m.method == "CONNECT":  # its content has no meaning (RFC 9110 9.3.6): h11 reads a body, llhttp
            break  # none, and inferd ends the connection after answering it
        assert (m.method, m.url, m.body) == h, f"message {i}: httptools reads {(m.method, m.url, m.body)!r:.300}, " \
                                               f"h11 {h!r:.300}"

    # an error answer needs something to refuse
    if fatal is not None:
        over_cap = fatal.status in (413, 414, 431, 417)
        unread = parsed < len(ref.messages) or ref.end in ("partial", "error")
        unread = unread or (ref.end == "connect" and ref.rest > 0)  # a tunnel's bytes: may be refused
        assert over_cap or unread, (
            f"error answer {fatal.status} {fatal.body[:120]!r} though every message was read and answered "
            f"(httptools: {len(ref.messages)} messages, {ref.end})")

    # bounded: a connection holds at most a few requests' worth of its caps, and the last read: caps are
    # checked read by read, so httptools may keep what one read brought (an unfinished line, or the read that
    # failed, until the connection closes)
    cap = run.caps["max_header_size"] + 2 * run.caps["max_body"]
    bound = (run.pipelined + 2) * cap + IDLE_HELD + max(map(len, reads), default=0)
    assert not run.measure or run.held <= bound, f"the connection holds {run.held} bytes once answered (bound {bound})"
