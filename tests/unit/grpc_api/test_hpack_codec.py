"""Our HPACK decoder against blocks made by the `hpack` package's encoder, and our stateless encoder
read back by the `hpack` package's decoder (RFC 7541)."""

from __future__ import annotations

import hpack
import pytest
from inferd.supervisor.grpc_api.http2.frames import COMPRESSION_ERROR, ConnectionError_
from inferd.supervisor.grpc_api.http2.hpack_codec import Decoder, HeaderListTooLarge, encode

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "localhost:8001"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
    ("user-agent", "grpc-python/1.85.1 grpc-c/50.0.0 (linux; chttp2)"),
    ("grpc-timeout", "29999m"),
]


def _str(fields: list[tuple[str, str]] | list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [
        (n if isinstance(n, str) else n.decode("latin-1"), v if isinstance(v, str) else v.decode("latin-1"))
        for n, v in fields
    ]


def _ours() -> Decoder:
    return Decoder(64 * 1024)


@pytest.mark.parametrize("huffman", [True, False])
def test_repeated_blocks_with_dynamic_table(huffman: bool) -> None:
    enc, dec = hpack.Encoder(), _ours()
    for i in range(20):
        fields = [*REQUEST, ("x-request", str(i)), ("x-same", "v" * 50)]
        block = enc.encode(fields, huffman=huffman)
        assert dec.decode(block) == fields
        if i:  # after the first call the repeated fields are one-byte dynamic references
            assert len(block) < 40
    assert dec.dynamic  # the client's inserts are in our table
    assert dec.size == sum(len(n) + len(v) + 32 for n, v in dec.dynamic)


@pytest.mark.parametrize("huffman", [True, False])
def test_non_ascii_and_empty_values(huffman: bool) -> None:
    enc, dec = hpack.Encoder(), _ours()
    fields = [(":method", "POST"), ("x-empty", ""), ("x-bin-bin", "\x00\xff\x7f"), ("x-latin", "caf\xe9")]
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in fields]
    assert dec.decode(enc.encode(raw, huffman=huffman)) == fields


def test_eviction_under_a_small_table() -> None:
    enc, dec = hpack.Encoder(), _ours()
    enc.header_table_size = 200  # the block starts with a size update (a multi-byte integer: 200 > 31)
    for i in range(30):
        fields = [(":path", "/a"), (f"x-key-{i % 7}", f"value-{i}" * 3), ("x-keep", "k")]
        assert dec.decode(enc.encode(fields)) == fields
        assert dec.table_limit == 200 and dec.size <= 200
    # a field larger than the whole table empties it and is not added
    big = [("x-big", "b" * 300)]
    assert dec.decode(enc.encode(big)) == big
    assert dec.dynamic == [] and dec.size == 0
    assert dec.decode(enc.encode([("x-keep", "k")])) == [("x-keep", "k")]


def test_table_size_updates_shrink_and_grow() -> None:
    enc, dec = hpack.Encoder(), _ours()
    fields = [(f"x-{i}", "v" * 40) for i in range(20)]
    assert dec.decode(enc.encode(fields)) == fields
    assert dec.size > 1000
    enc.header_table_size = 100
    assert dec.decode(enc.encode(fields[:2])) == fields[:2]
    assert dec.table_limit == 100 and dec.size <= 100
    enc.header_table_size = 0  # clears the table
    assert dec.decode(enc.encode(fields[:1])) == fields[:1]
    assert dec.dynamic == [] and dec.size == 0
    enc.header_table_size = 4096
    assert dec.decode(enc.encode(fields)) == fields
    assert dec.decode(enc.encode(fields)) == fields  # now all references
    # above what we allow (we never raise SETTINGS_HEADER_TABLE_SIZE past 4096)
    with pytest.raises(ConnectionError_) as err:
        dec.decode(bytes([0x3F]) + _int_tail(8192 - 31))
    assert err.value.code == COMPRESSION_ERROR


def _int_tail(value: int) -> bytes:
    """The continuation bytes of an HPACK integer (RFC 7541 §5.1) after a full prefix."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_never_indexed_literals_stay_out_of_the_table() -> None:
    enc, dec = hpack.Encoder(), _ours()
    fields = [
        hpack.NeverIndexedHeaderTuple("authorization", "Bearer secret"),
        ("x-plain", "1"),
        ("cookie", "short"),  # hpack never indexes short cookies
    ]
    block = enc.encode(fields)
    assert dec.decode(block) == [("authorization", "Bearer secret"), ("x-plain", "1"), ("cookie", "short")]
    assert ("authorization", "Bearer secret") not in dec.dynamic
    assert ("x-plain", "1") in dec.dynamic


def test_multi_byte_integers() -> None:
    enc, dec = hpack.Encoder(), _ours()
    long_name = "x-" + "n" * 300  # name length 302 > 127: a multi-byte string length
    fields = [(long_name, "v" * 20000)]  # value length needs three bytes
    assert dec.decode(enc.encode(fields, huffman=False)) == fields
    assert dec.decode(enc.encode(fields, huffman=True)) == fields
    # dynamic index above 127 (0xFF + continuation bytes): fill the table with many small entries
    dec2, enc2 = _ours(), hpack.Encoder()
    many = [(f"k{i}", "v") for i in range(100)]  # 35..36 bytes each: 100 entries fit in 4096
    assert dec2.decode(enc2.encode(many)) == many
    block = enc2.encode([many[0]])  # the oldest entry: index 61 + ~100
    assert block[0] == 0xFF and len(block) == 2
    assert dec2.decode(block) == [many[0]]


def test_header_list_too_large_keeps_the_table_in_step() -> None:
    enc, dec = hpack.Encoder(), Decoder(1000)
    big = [("x-a", "a" * 600), ("x-b", "b" * 600), ("x-c", "c" * 10)]  # x-b crosses the limit
    with pytest.raises(HeaderListTooLarge):
        dec.decode(enc.encode(big))
    # the encoder inserted every field; the next block refers to them by index
    assert dec.decode(enc.encode([("x-c", "c" * 10)])) == [("x-c", "c" * 10)]
    assert dec.decode(enc.encode([("x-b", "b" * 600)])) == [("x-b", "b" * 600)]
    assert dec.decode(enc.encode([("x-a", "a" * 600)])) == [("x-a", "a" * 600)]


GARBAGE = [
    b"\x80",  # indexed field 0
    b"\xbf",  # static index 63: past the static table, the dynamic one is empty
    b"\xff\xff\xff\xff\xff\xff\x7f",  # integer over 28 bits
    b"\xff",  # truncated integer
    b"\x40",  # literal with indexing, nothing after
    b"\x40\x05ab",  # name shorter than its length
    b"\x00\x01a\x85abc",  # value shorter than its length
    b"\x00\x81\xff",  # Huffman name holding EOS padding bits that are not all ones... or EOS
    b"\x00\x84\xff\xff\xff\xff\x01a",  # Huffman EOS symbol inside a string
    b"\x3f\xe1\x7f",  # size update above the limit
    b"\x0f",  # literal name index, truncated integer
]


@pytest.mark.parametrize("block", GARBAGE, ids=lambda b: b.hex())
def test_garbage_is_a_compression_error(block: bytes) -> None:
    with pytest.raises(ConnectionError_) as err:
        _ours().decode(block)
    assert err.value.code == COMPRESSION_ERROR


def test_random_bytes_never_crash() -> None:
    import random

    rng = random.Random(1234)
    valid = hpack.Encoder().encode(REQUEST)
    for _ in range(3000):
        if rng.random() < 0.5:
            block = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:  # a valid block with a few bytes changed or cut
            b = bytearray(valid[: rng.randrange(1, len(valid) + 1)])
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            block = bytes(b)
        try:
            out = Decoder(4096).decode(block)
        except (ConnectionError_, HeaderListTooLarge):
            continue
        assert all(isinstance(n, str) and isinstance(v, str) for n, v in out)


def test_encode_is_read_by_hpack() -> None:
    fields = [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
        ("grpc-status", "3"),
        ("grpc-message", "x" * 300),  # multi-byte length
        (":status", "405"),  # static name, other value
        ("content-length", "0"),
        ("x-custom", ""),
    ]
    block = encode(fields)
    assert _str(hpack.Decoder().decode(block)) == fields
    # stateless: no inserts into the peer's table, so the same block decodes again alone
    d = hpack.Decoder()
    assert _str(d.decode(block)) == fields and _str(d.decode(block)) == fields
    assert len(d.header_table.dynamic_entries) == 0
    assert encode([(":status", "200")]) == b"\x88"  # static table reference
    assert _ours().decode(block) == fields
