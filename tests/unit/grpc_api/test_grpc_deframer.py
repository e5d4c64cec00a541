"""gRPC length-prefixed messages out of DATA payloads however the payloads are cut (grpc_calls.Deframer)."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from inferd.supervisor.grpc_api.http2.grpc_wire import INTERNAL, RESOURCE_EXHAUSTED, Abort, Deframer

MESSAGES = [b"hello", b"", b"\x00" * 5, bytes(range(256)) * 3, b"", b"x"]


def _frame(message: bytes, flag: int = 0, length: int | None = None) -> bytes:
    return struct.pack(">BI", flag, len(message) if length is None else length) + message


def _feed_all(d: Deframer, pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for piece in pieces:
        got = d.feed(memoryview(piece))
        assert all(type(m) in (bytes, bytearray) for m in got)  # owned copies, never views into a payload
        out += got
    return out


def test_several_messages_in_one_payload() -> None:
    d = Deframer(1 << 20, None)
    assert _feed_all(d, [b"".join(map(_frame, MESSAGES))]) == MESSAGES
    assert d.idle


def test_split_at_every_byte_boundary() -> None:
    payload = b"".join(map(_frame, MESSAGES))
    for cut in range(len(payload) + 1):
        d = Deframer(1 << 20, None)
        assert _feed_all(d, [payload[:cut], payload[cut:]]) == MESSAGES, cut
        assert d.idle
    for a in range(0, len(payload), 7):  # two cuts
        for b in range(a, len(payload), 11):
            d = Deframer(1 << 20, None)
            assert _feed_all(d, [payload[:a], payload[a:b], payload[b:]]) == MESSAGES, (a, b)


def test_one_byte_at_a_time() -> None:
    payload = b"".join(map(_frame, MESSAGES))
    d = Deframer(1 << 20, None)
    got = _feed_all(d, [payload[i : i + 1] for i in range(len(payload))])
    assert got == MESSAGES and d.idle


def test_not_idle_inside_a_message() -> None:
    d = Deframer(100, None)
    assert d.feed(memoryview(_frame(b"abc")[:3])) == [] and not d.idle  # inside the prefix
    assert d.feed(memoryview(_frame(b"abc")[3:6])) == [] and not d.idle  # inside the body
    assert d.feed(memoryview(b"bc")) == [b"abc"] and d.idle


def test_zero_length_messages_alone() -> None:
    d = Deframer(10, None)
    assert d.feed(memoryview(_frame(b""))) == [b""]
    assert d.feed(memoryview(_frame(b"") * 3)) == [b"", b"", b""]
    assert d.feed(memoryview(_frame(b"")[:2])) == [] and not d.idle
    assert d.feed(memoryview(_frame(b"")[2:])) == [b""] and d.idle


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_messages(encoding: str) -> None:
    pack = gzip.compress if encoding == "gzip" else zlib.compress
    plain = [b"a" * 10000, b"", bytes(range(256)) * 40]
    payload = b"".join(_frame(pack(m), 1) for m in plain) + _frame(b"raw")  # flag 0 stays raw
    for cut in range(0, len(payload), 13):
        d = Deframer(1 << 20, encoding)
        assert _feed_all(d, [payload[:cut], payload[cut:]]) == [*plain, b"raw"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decompressed_size_is_bounded(encoding: str) -> None:
    pack = gzip.compress if encoding == "gzip" else zlib.compress
    bomb = pack(b"\0" * (1 << 20))  # ~1 KiB that inflates to 1 MiB
    d = Deframer(64 * 1024, encoding)
    with pytest.raises(Abort) as err:
        d.feed(memoryview(_frame(bomb, 1)))
    assert err.value.code == RESOURCE_EXHAUSTED
    d = Deframer(1 << 20, encoding)  # exactly at the limit is fine
    assert d.feed(memoryview(_frame(bomb, 1))) == [b"\0" * (1 << 20)]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_corrupt_or_truncated_compressed_message(encoding: str) -> None:
    pack = gzip.compress if encoding == "gzip" else zlib.compress
    for body in (b"not compressed at all", pack(b"hello world" * 100)[:-6]):
        with pytest.raises(Abort) as err:
            Deframer(1 << 20, encoding).feed(memoryview(_frame(body, 1)))
        assert err.value.code == INTERNAL


def test_declared_length_over_the_max_aborts_before_the_data() -> None:
    d = Deframer(1000, None)
    with pytest.raises(Abort) as err:
        d.feed(memoryview(_frame(b"", length=1001)))  # the prefix alone: no body has arrived
    assert err.value.code == RESOURCE_EXHAUSTED and "1001" in err.value.message
    d = Deframer(1000, None)
    assert d.feed(memoryview(_frame(b"", length=2**32 - 1)[:4])) == []
    with pytest.raises(Abort):
        d.feed(memoryview(b"\xff"))
    assert Deframer(1000, None).feed(memoryview(_frame(b"y" * 1000))) == [b"y" * 1000]


@pytest.mark.parametrize("encoding", [None, "identity"])
def test_compressed_flag_without_an_encoding(encoding: str | None) -> None:
    d = Deframer(1000, encoding)
    with pytest.raises(Abort) as err:
        d.feed(memoryview(_frame(gzip.compress(b"x"), 1)))
    assert err.value.code == INTERNAL
