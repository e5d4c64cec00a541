"""A connection reads a request whose head repeats the last one without the parser
(supervisor/http_api/request_reader.py): it must hand on exactly what the parser hands on, and a head
that changes how a request is read (Expect, chunked, close, bare line feeds, pipelined or split reads)
is never read again that way.

Each case feeds the same reads to a connection that reuses heads and to one that parses everything,
and compares what reaches the handler and what goes back to the client.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import uvloop
from inferd.supervisor.http_api.connection import HttpConnection, KeepCaseConnection
from inferd.supervisor.http_api.server import HttpServer

from .rawhttp import RawConn

MAX_BODY = 4096
BODY = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
HEAD = (b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY))


class Transport:
    """Records what the connection writes, and whether it closed."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.out += p

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.out += b"<EOF>"

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, *args: Any, **kwargs: Any) -> None:
        return None


class Recording(HttpConnection):
    """Hands nothing on: keeps each request the handler would get."""

    def __init__(self, server: HttpServer) -> None:
        super().__init__(server)
        self.got: list[tuple[Any, ...]] = []
        self.reused = 0

    def _again(self, data: bytes, start: int) -> None:
        self.reused += 1
        super()._again(data, start)

    def _dispatch(self, item: Any) -> None:
        req = getattr(item, "req", item)  # (a Refused carries its request)
        self.got.append((type(item).__name__, req.method, req.path, req.query, dict(req.headers),
                         bytes(req.body), req.keep_alive))


class Parsing(Recording):
    _learns = False


async def _handler(req: Any) -> Any:
    raise AssertionError("not called: _dispatch records instead")


def feed(cls: type[Recording], reads: list[bytes]) -> tuple[list[tuple[Any, ...]], bytes, bool, int]:
    """What a connection of `cls` hands on for these reads, what it writes back, whether it closed, and
    how many requests it read without the parser."""

    async def run() -> tuple[list[tuple[Any, ...]], bytes, bool, int]:
        server = HttpServer(_handler, max_body=MAX_BODY, max_header_size=1024, max_headers=20)
        conn = cls(server)
        transport = Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        for data in reads:
            if transport.closed:
                break
            conn.data_received(data)
        await asyncio.sleep(0)  # (held answers leave at the pass's end)
        server.coalescer.flush()
        conn.connection_lost(None)
        return conn.got, bytes(transport.out), transport.closed, conn.reused

    return uvloop.run(run())


def same(reads: list[bytes]) -> int:
    """Both connections agree on `reads`; returns how many were read without the parser."""
    fast = feed(Recording, reads)
    slow = feed(Parsing, reads)
    assert fast[:3] == slow[:3]
    return fast[3]


def test_a_repeated_head_is_read_without_the_parser_and_reads_the_same() -> None:
    req = HEAD + BODY
    assert same([req] * 5) == 4
    got = feed(Recording, [req] * 3)[0]
    assert got[0] == got[2] and got[0][1:4] == ("POST", "/v2/models/m/infer", "x=1")
    assert got[2][5] == BODY and got[2][4]["content-length"] == str(len(BODY))


def test_each_request_gets_its_own_headers() -> None:
    async def run() -> None:
        server = HttpServer(_handler, max_body=MAX_BODY)
        conn = Recording(server)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        seen = []
        conn._dispatch = seen.append  # type: ignore[method-assign]
        for _ in range(3):
            conn.data_received(HEAD + BODY)
        seen[1].headers["content-type"] = "changed"
        conn.data_received(HEAD + BODY)
        assert seen[3].headers["content-type"] == "application/json"
        assert len({id(r.headers) for r in seen}) == 4

    uvloop.run(run())


@pytest.mark.parametrize("head", [
    HEAD.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"),
    HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
    HEAD.replace(b"HTTP/1.1", b"HTTP/1.0"),
    HEAD.replace(b"Host: h\r\n", b"Host: h\n"),  # a bare line feed (llhttp tolerates it)
    HEAD.replace(b"\r\n\r\n", b"\r\nX-Pad: %s\r\n\r\n" % (b"a" * 1000)),  # longer than the kept heads
])
def test_heads_that_change_how_a_request_is_read_are_not_kept(head: bytes) -> None:
    assert same([head + BODY] * 3) == 0


def test_a_chunked_body_is_not_kept() -> None:
    chunked = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
    assert same([chunked] * 3) == 0


def test_after_a_close_request_a_kept_head_is_not_used() -> None:
    closing = HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + BODY
    assert same([HEAD + BODY, closing, HEAD + BODY]) == 0


def test_pipelined_split_and_wrong_length_reads_go_through_the_parser() -> None:
    req = HEAD + BODY
    assert same([req, req + req, req]) == 1  # two in one read: parsed; the head kept before stays
    assert same([req, req[:10], req[10:], req]) == 1  # split: parsed
    assert same([req, HEAD + BODY + b"x"]) == 0  # a byte more than the kept length: parsed (400)
    assert same([req, HEAD + BODY[:-1], BODY[-1:], req]) == 1  # a byte less: parsed, waits for the rest


def test_the_body_cap_is_checked_before_a_head_is_kept() -> None:
    big = b"x" * (MAX_BODY + 1)
    head = HEAD.replace(b"Content-Length: %d" % len(BODY), b"Content-Length: %d" % len(big))
    assert same([head + big, head + big]) == 0


def test_keep_case_connections_always_parse() -> None:
    async def run() -> None:
        server = HttpServer(_handler, max_body=MAX_BODY, keep_header_case=True)
        conn = KeepCaseConnection(server)
        conn._dispatch = lambda item: None  # type: ignore[method-assign]
        conn.connection_made(Transport())  # type: ignore[arg-type]
        conn.data_received(HEAD + BODY)
        assert conn._head is None

    uvloop.run(run())


def test_random_mutations_read_the_same_with_and_without_reuse() -> None:
    """Reads that start as a kept request and are then cut, doubled or have bytes changed: whatever the
    reuse takes must be what the parser takes, and errors must be the same errors."""
    rng = random.Random(25)
    base = HEAD + BODY
    reused = 0
    for _ in range(400):
        reads = [base]
        for _ in range(rng.randint(1, 6)):
            data = bytearray(base)
            kind = rng.random()
            if kind < 0.4:
                pass  # the same request again
            elif kind < 0.7:
                i = rng.randrange(len(data))
                data[i] = rng.choice(b"\r\n :aZ0{}\x00\x7f")
            elif kind < 0.8:
                del data[rng.randrange(len(data)):]
            elif kind < 0.9:
                data += base[: rng.randrange(len(base))]
            else:
                i = rng.randrange(len(data))
                data[i:i] = rng.choice([b"\r\n", b"Expect: 100-continue\r\n", b"Connection: close\r\n", b" "])
            reads.append(bytes(data))
        reused += same(reads)
    assert reused > 200  # the reuse really ran


def test_served_requests_with_a_kept_head(served: Any) -> None:
    """Over a socket to the real server: the same request again and again, then one that differs only
    in its body length, all answered."""
    conn = RawConn(served.port)
    try:
        for n in (1, 1, 1, 2, 2, 1):
            data = ",".join(["1"] * n)
            body = ('{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"FP32","data":[%s]}]}' % (n, data)).encode()
            conn.send(b"POST /v2/models/identity_FP32/infer HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            status, _, raw = conn.read_response()
            assert status == 200 and raw.count(b"1.0") == n
    finally:
        conn.close()
