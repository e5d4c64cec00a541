"""The gRPC server's shortcuts for the common call give exactly what the general code gives:

- a unary answer packed in one write (sending.response_frames) is byte for byte the frames frames.header
  builds (what respond wrote before), small and large, with the content the split path
  (send_headers / send_data / send_trailers) sends;
- single_message takes a single-frame message only when a Deframer's feed would return exactly that message;
- the HPACK decoder's remembered blocks decode like a decoder that remembers nothing, through table
  inserts, evictions and size updates;
- the request head read once per remembered block is what reading the headers gives.
"""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Any

import hpack
import pytest
from inferd.supervisor.grpc_api.http2 import frames as f
from inferd.supervisor.grpc_api.http2.connection import H2Connection
from inferd.supervisor.grpc_api.http2.grpc_wire import RESPONSE_HEAD, TRAILERS_OK, Deframer, single_message, trailers
from inferd.supervisor.grpc_api.http2.hpack_codec import BLOCK_CACHE, Decoder, HeaderList
from inferd.supervisor.grpc_api.http2.sending import JOIN_LIMIT
from inferd.supervisor.grpc_api.native_server import _request_head


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.writes = 0

    def write(self, data: Any) -> None:
        self.out += data
        self.writes += 1

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.out += p
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


class _App:
    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def connection_made(self, conn: H2Connection) -> None:
        pass

    def connection_lost(self, conn: H2Connection) -> None:
        pass

    def open_stream(self, conn: H2Connection, sid: int, headers: Any, end: bool) -> Any:
        handler = _Handler()
        self.handlers.append(handler)
        return handler


class _Handler:
    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        pass

    def on_reset(self) -> None:
        pass


def _connection(max_frame: int) -> tuple[H2Connection, _Transport]:
    """A connection with one open stream (1) whose client allows frames of `max_frame` bytes and windows
    large enough for any answer here."""
    conn, transport = H2Connection(_App()), _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    if conn._handshake is not None:
        conn._handshake.cancel()
    big = f.MAX_WINDOW - f.DEFAULT_WINDOW
    enc = hpack.Encoder()
    block = enc.encode([(":method", "POST"), (":path", "/x"), ("content-type", "application/grpc")])
    conn.data_received(
        f.PREFACE
        + f.settings({f.MAX_FRAME_SIZE: max_frame, f.INITIAL_WINDOW_SIZE: f.MAX_WINDOW})
        + f.window_update(0, big)
        + f.header(len(block), f.HEADERS, f.END_HEADERS | f.END_STREAM, 1)
        + block
    )
    assert 1 in conn.streams
    transport.out.clear()
    transport.writes = 0
    return conn, transport


def _message(size: int) -> list[Any]:
    body = bytes(random.Random(size).getrandbits(8) for _ in range(min(size, 4096)))
    body = (body * (size // max(len(body), 1) + 1))[:size]
    half = size // 2
    return [struct.pack(">BI", 0, size), memoryview(body[:half]), body[half:]]


@pytest.mark.parametrize("size", [0, 1, 200, JOIN_LIMIT - 5, JOIN_LIMIT - 4, JOIN_LIMIT + 100, 300_000])
@pytest.mark.parametrize("trailer", [TRAILERS_OK, trailers(3, "bad input: %x ü " * 20)])
def test_one_write_answer_is_the_split_answer(size: int, trailer: bytes) -> None:
    asyncio.run(_in_loop(_one_write_answer, size, trailer))


async def _in_loop(fn: Any, *args: Any) -> None:
    """H2Connection wants a running loop (its handshake timer)."""
    fn(*args)


def _one_write_answer(size: int, trailer: bytes) -> None:
    pieces = _message(size)
    total = size + 5
    fast, fast_out = _connection(1 << 20)
    assert fast.respond(1, RESPONSE_HEAD, pieces, total, trailer)
    assert fast_out.writes == 1  # the whole answer in one write
    # the frames as frames.header builds them, one DATA frame for the message
    reference = b"".join([f.header(len(RESPONSE_HEAD), f.HEADERS, f.END_HEADERS, 1), RESPONSE_HEAD,
                          f.header(total, f.DATA, 0, 1), *pieces,
                          f.header(len(trailer), f.HEADERS, f.END_HEADERS | f.END_STREAM, 1), trailer])
    assert bytes(fast_out.out) == reference
    assert 1 not in fast.streams  # the stream ended
    # and the split path (a DATA frame per piece) says the same
    split, split_out = _connection(1 << 20)
    split.send_headers(1, RESPONSE_HEAD)
    split.send_data(1, pieces)
    split.send_trailers(1, trailer)
    assert _content(bytes(split_out.out)) == _content(reference)


def _content(stream: bytes) -> tuple[list[bytes], bytes, int]:
    """(header blocks, DATA bytes joined, flags of the last frame) of a run of frames."""
    blocks, data, pos, flags = [], b"", 0, 0
    while pos < len(stream):
        length, ftype, flags, _sid = f.parse_header(stream, pos)
        payload = stream[pos + 9 : pos + 9 + length]
        if ftype == f.HEADERS:
            blocks.append(payload)
        else:
            data += payload
        pos += 9 + length
    return blocks, data, flags


def test_an_answer_larger_than_a_frame_goes_the_split_way() -> None:
    asyncio.run(_in_loop(_larger_than_a_frame))


def _larger_than_a_frame() -> None:
    pieces = _message(40_000)
    conn, out = _connection(f.DEFAULT_MAX_FRAME)
    assert conn.respond(1, RESPONSE_HEAD, pieces, 40_005, TRAILERS_OK)
    split, split_out = _connection(f.DEFAULT_MAX_FRAME)
    split.send_headers(1, RESPONSE_HEAD)
    split.send_data(1, pieces)
    split.send_trailers(1, TRAILERS_OK)
    assert bytes(out.out) == bytes(split_out.out)


# ---- single_message ----
def _prefixed(body: bytes, flag: int = 0, length: int | None = None) -> bytes:
    return struct.pack(">BI", flag, len(body) if length is None else length) + body


@pytest.mark.parametrize(
    "payload",
    [
        _prefixed(b""),
        _prefixed(b"x"),
        _prefixed(bytes(range(256)) * 4),
        _prefixed(b"abc") + _prefixed(b"d"),  # two messages
        _prefixed(b"abc", length=10),  # a message cut short
        _prefixed(b"abcdef", length=2),  # a message and a partial prefix
        _prefixed(b"abc", flag=1),  # compressed
        _prefixed(b"y" * 1019),  # at the limit below
        _prefixed(b"y" * 1025),  # above it
        b"\x00\x00",  # a partial prefix
    ],
)
def test_single_message_is_feed_or_nothing(payload: bytes) -> None:
    limit = 1024
    got = single_message(memoryview(payload), limit)
    ref = Deframer(limit, "gzip")
    try:
        fed = ref.feed(memoryview(payload))
        complete = ref.idle
    except Exception:
        fed, complete = None, False
    if got is not None:
        assert type(got) is bytes
        assert fed == [got] and complete
    else:  # refused: feed gives something else (several, none, an error) or it is compressed
        assert payload[:1] == b"\x01" or not (fed is not None and len(fed) == 1 and complete)


# ---- HPACK: remembered blocks ----
def _random_headers(rng: random.Random) -> list[tuple[str, str]]:
    pool = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", "h:8001"), ("content-type", "application/grpc"), ("te", "trailers"),
            ("user-agent", "ua/1"), ("x-a", "1"), ("x-b", "two"), ("grpc-timeout", "100m")]
    fields = [field for field in pool if rng.random() < 0.8]
    if rng.random() < 0.3:
        fields.append((f"x-new-{rng.randrange(40)}", "v" * rng.randrange(60)))
    return fields


def test_remembered_blocks_decode_like_a_fresh_decoder() -> None:
    rng = random.Random(7)
    enc = hpack.Encoder()
    cached = Decoder(64 * 1024)
    for i in range(3000):
        if i % 500 == 250:
            enc.header_table_size = rng.choice([0, 256, 4096])  # a size update in the next block
        headers = _random_headers(rng)
        block = enc.encode(headers, huffman=bool(rng.getrandbits(1)))
        reference = Decoder(64 * 1024)  # the same table, nothing remembered
        reference.dynamic, reference.size, reference.table_limit = list(cached.dynamic), cached.size, cached.table_limit
        want = reference.decode(block)
        got = cached.decode(block)
        assert list(got) == list(want) == headers, i
        assert cached.dynamic == reference.dynamic and cached.table_limit == reference.table_limit
        again = cached.decode(block) if cached.dynamic == reference.dynamic and block in cached.blocks else None
        if again is not None:
            assert again is got  # remembered: the same list
        assert len(cached.blocks) <= BLOCK_CACHE


def test_a_table_change_forgets_remembered_blocks() -> None:
    enc = hpack.Encoder()
    dec = Decoder(64 * 1024)
    first = enc.encode([("x-k", "one")])  # inserted into the table
    assert dec.decode(first) == [("x-k", "one")]
    ref = enc.encode([("x-k", "one")])  # now a one-byte table reference
    got = dec.decode(ref)
    assert got == [("x-k", "one")] and dec.decode(ref) is got
    dec.decode(enc.encode([("x-other", "two")]))  # inserts: the index of x-k moves
    assert ref not in dec.blocks
    assert dec.decode(ref) == [("x-other", "two")]  # the same bytes now mean the newer entry


def test_request_head_from_headers() -> None:
    headers = HeaderList()
    headers.extend([(":method", "POST"), (":path", "/s/M"), (":scheme", "http"), ("content-type", "application/grpc"),
                    ("grpc-timeout", "5S"), ("grpc-encoding", "gzip"), ("x-meta", "v"), ("te", "trailers")])
    *head, context = _request_head(headers)
    assert head == ["/s/M", "POST", "application/grpc", "5S", "gzip"]
    assert context.invocation_metadata() == (("x-meta", "v"), ("te", "trailers"))


def test_a_one_write_answer_forgives_ping_strikes() -> None:
    """The one-write answer forgives the client's PING strikes only when a PING came (it skips the call
    otherwise): strikes counted before an answer are gone after it, as grpc-core forgives them."""
    asyncio.run(_in_loop(_ping_strikes_forgiven))


def _ping_strikes_forgiven() -> None:
    def pings(conn: H2Connection, n: int) -> None:
        for _ in range(n):
            conn.data_received(f.ping(b"12345678"))

    conn, out = _connection(1 << 20)
    pings(conn, 3)  # the first is on time, the next two early: two strikes, the limit
    assert conn.guard.pings.strikes == 2
    assert conn.respond(1, RESPONSE_HEAD, [struct.pack(">BI", 0, 0)], 5, TRAILERS_OK)
    assert conn.guard.pings.strikes == 0
    _open_stream(conn, 3)
    pings(conn, 3)  # after the answer: again one on time and two strikes, not a flood
    assert not conn.cut and conn.guard.pings.strikes == 2
    assert conn.respond(3, RESPONSE_HEAD, [struct.pack(">BI", 0, 0)], 5, TRAILERS_OK)
    assert conn.guard.pings.strikes == 0
    # without an answer in between, the next PING beyond the limit ends the connection
    _open_stream(conn, 5)
    pings(conn, 4)
    assert conn.cut and f.GOAWAY in _frame_types(bytes(out.out))


def _open_stream(conn: H2Connection, sid: int) -> None:
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/x"), ("content-type", "application/grpc")])
    conn.data_received(f.header(len(block), f.HEADERS, f.END_HEADERS | f.END_STREAM, sid) + block)
    assert sid in conn.streams


def _frame_types(stream: bytes) -> list[int]:
    types, pos = [], 0
    while pos + 9 <= len(stream):
        length, ftype, _flags, _sid = f.parse_header(stream, pos)
        types.append(ftype)
        pos += 9 + length
    return types
