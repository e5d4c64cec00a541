"""A sequence of HPACK header blocks -> inferd's decoder (grpc_api/http2/hpack_codec.py), differential against
the `hpack` package's Decoder fed the same blocks in the same order (one connection's decoding context).

The blocks are fuzz bytes, blocks the `hpack` Encoder made of fuzz-chosen headers (dynamic table inserts,
Huffman strings, never-indexed fields, table size updates), and repeats of earlier blocks (inferd remembers
blocks that left the table as it was: a repeat must decode from that cache to the same list). For every
block both decode to the same header list and leave the same dynamic table, or both refuse it. Refusals
end the comparison (a COMPRESSION_ERROR ends the connection; a header list over the limit leaves the two
tables in different states: `hpack` stops at the limit, inferd decodes the whole block so that its table
stays in step with the client's encoder, as connection.py needs).

Differences the RFC leaves to the decoder, accepted here (besides which refusal: a block over the header list
limit that is also malformed further on is refused by both, as too large by `hpack`, as malformed by inferd):
- a dynamic table size update after a header field in the block: `hpack` refuses it, inferd applies it
  (RFC 7541 §4.2 asks the encoder to put it first; the size it sets is still checked against our limit);
- an integer longer than 5 continuation bytes: inferd refuses it (§5.1: an implementation limit on octet
  length), `hpack` reads it.
Our encoder (`hpack_codec.encode`) is checked too: its blocks decode, with both decoders, to what was encoded.
"""

from __future__ import annotations

from typing import Any

import hpack
from _fdp import provider
from inferd.supervisor.grpc_api.http2 import hpack_codec
from inferd.supervisor.grpc_api.http2.frames import ConnectionError_

MAX_LEN = 4096
MAX_HEADER_LIST = 64 * 1024  # the connection's (connection.MAX_HEADER_LIST)
NAMES = [":path", ":method", ":authority", "content-type", "te", "grpc-timeout", "grpc-encoding", "user-agent",
         "x-custom", "authorization", "cookie", "", "grpc-accept-encoding", "a" * 40]
DICT = [b"\x3f\xe1\x1f", b"\x20", b"\x40", b"\x10", b"\x00", b"\x80", b"\xff\xff\xff\xff\x0f",
        b"\x7f\x80\x80\x80\x80\x80\x00"]


def _text(fdp: Any, limit: int) -> bytes:
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, limit))


def _encoded(fdp: Any, encoder: hpack.Encoder) -> bytes:
    headers = []
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        name = fdp.PickValueInList(NAMES).encode() if fdp.ConsumeBool() else _text(fdp, 10).lower()
        value = _text(fdp, 30) * (fdp.ConsumeIntInRange(1, 200) if fdp.ConsumeIntInRange(0, 15) == 0 else 1)
        headers.append(hpack.NeverIndexedHeaderTuple(name, value) if fdp.ConsumeIntInRange(0, 7) == 0
                       else (name, value))
    if fdp.ConsumeIntInRange(0, 7) == 0:
        encoder.header_table_size = fdp.PickValueInList([0, 1, 64, 100, 4096])  # a size update leads the block
    return bytes(encoder.encode(headers, huffman=fdp.ConsumeBool()))


def _ours(decoder: hpack_codec.Decoder, block: bytes) -> tuple[str, Any]:
    try:
        return "ok", [(n.encode("latin-1"), v.encode("latin-1")) for n, v in decoder.decode(block)]
    except hpack_codec.HeaderListTooLarge:
        return "too_large", None
    except ConnectionError_ as exc:
        return "error", str(exc)


def _theirs(decoder: hpack.Decoder, block: bytes) -> tuple[str, Any]:
    try:
        return "ok", [(bytes(n), bytes(v)) for n, v in decoder.decode(block, raw=True)]
    except hpack.OversizedHeaderListError:
        return "too_large", None
    except hpack.HPACKError as exc:  # HPACKDecodingError, InvalidTableIndex, InvalidTableSizeError
        return "error", f"{type(exc).__name__}: {exc}"


def _tables(ours: hpack_codec.Decoder, theirs: hpack.Decoder) -> None:
    mine = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in ours.dynamic]
    other = [(bytes(n), bytes(v)) for n, v in theirs.header_table.dynamic_entries]
    assert mine == other, f"dynamic tables differ: {mine[:4]!r}... vs {other[:4]!r}..."
    size = theirs.header_table._current_size
    assert ours.size == size, f"table size {ours.size} vs {size}"
    assert ours.table_limit == theirs.header_table.maxsize, "table size limits differ"


def test_one_input(data: bytes) -> None:
    fdp = provider(data)
    ours = hpack_codec.Decoder(MAX_HEADER_LIST)
    theirs = hpack.Decoder(MAX_HEADER_LIST)
    encoder = hpack.Encoder()
    sent: list[bytes] = []
    for _ in range(fdp.ConsumeIntInRange(1, 12)):
        kind = fdp.ConsumeIntInRange(0, 3)
        if kind == 0 and sent:
            block = fdp.PickValueInList(sent)  # a repeat: inferd may answer it from its block cache
        elif kind == 1:
            block = _text(fdp, 64)
        else:
            block = _encoded(fdp, encoder)
        sent.append(block)
        a, b = _ours(ours, block), _theirs(theirs, block)
        if a[0] != "error" and b[0] == "error" and "Table size update not at the start" in b[1]:
            return  # the accepted difference (see above); the tables may differ from here on
        if a[0] == "error" and b[0] == "ok" and "integer too large" in a[1]:
            return
        if a[0] == "error" and b[0] == "too_large":
            return  # both refuse: hpack stopped at the limit, inferd read on (see above) into an error
        assert a[0] == b[0], f"block {block!r}: inferd {a}, hpack {b}"
        if a[0] != "ok":
            return
        assert a[1] == b[1], f"block {block!r} decoded to {a[1]!r}, hpack {b[1]!r}"
        _tables(ours, theirs)

    # our (stateless) encoder: what it encodes decodes back, with both decoders
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in (a[1] if sent else [])]
    block = hpack_codec.encode(headers)
    assert hpack_codec.Decoder(MAX_HEADER_LIST).decode(block) == headers, "our encoder's block decodes otherwise"
    back = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1"))
            for n, v in hpack.Decoder(MAX_HEADER_LIST).decode(block, raw=True)]
    assert back == headers, "hpack reads our encoder's block otherwise"
