"""HPACK (RFC 7541): a header-block decoder fast on the common case, and stateless header encoding.

A gRPC client sends nearly the same headers on every call, so after the first call its header
blocks are mostly one-byte references into the tables: those take a list lookup here (the `hpack`
package's decoder spends ~25 us per block on them). Huffman-coded strings and the static table come
from the `hpack` package. What we send is encoded without touching the peer's dynamic table
(literals "without indexing"), so encoding needs no state and common blocks are built once.
"""

from __future__ import annotations

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from .frames import COMPRESSION_ERROR, ConnectionError_

_STATIC: tuple[tuple[str, str], ...] = tuple(
    (n.decode("latin-1"), v.decode("latin-1")) for n, v in HeaderTable.STATIC_TABLE
)
_STATIC_LEN = len(_STATIC)  # 61
DEFAULT_TABLE_SIZE = 4096


# Header blocks that left the dynamic table as it was are remembered, per connection, with what they decoded
# to: a client's calls after the first are usually the same bytes (table references and literals without
# indexing), and the same bytes against the same table decode to the same list. Any block that changes
# the table forgets them all.
BLOCK_CACHE = 16  # blocks per connection (then forgotten all at once)
BLOCK_CACHE_BYTES = 1024  # longer blocks are not remembered


class HeaderListTooLarge(Exception):
    pass


class HeaderList(list[tuple[str, str]]):
    """A decoded header list, shared by every call whose block decoded to it (read only). `memo` is the
    application's: what it made of these headers, kept with them."""

    __slots__ = ("memo",)

    def __init__(self) -> None:
        super().__init__()
        self.memo: object = None


class Decoder:
    def __init__(self, max_header_list: int) -> None:
        self.max_header_list = max_header_list
        self.max_table = DEFAULT_TABLE_SIZE  # what we allow (we never change SETTINGS_HEADER_TABLE_SIZE)
        self.table_limit = DEFAULT_TABLE_SIZE  # what the encoder chose (size updates)
        self.dynamic: list[tuple[str, str]] = []  # newest first
        self.size = 0
        self.blocks: dict[bytes, HeaderList] = {}  # blocks that did not change the table -> their headers
        self.changes = 0  # table changes so far

    def _entry(self, index: int) -> tuple[str, str]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        i = index - _STATIC_LEN - 1
        if 0 <= i < len(self.dynamic):
            return self.dynamic[i]
        raise ConnectionError_(COMPRESSION_ERROR, f"HPACK index {index} out of range")

    def _add(self, name: str, value: str) -> None:
        self._changed()
        self.dynamic.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _changed(self) -> None:
        self.changes += 1
        self.blocks.clear()

    def _evict(self) -> None:
        while self.size > self.table_limit and self.dynamic:
            n, v = self.dynamic.pop()
            self.size -= len(n) + len(v) + 32

    def decode(self, block: bytes) -> HeaderList:
        """The block's header list; the same object for the same bytes while the table is unchanged (do not
        modify it)."""
        out = self.blocks.get(block)
        if out is not None:
            return out
        out = HeaderList()
        changes = self.changes
        total = 0
        pos = 0
        end = len(block)
        try:
            while pos < end:
                b = block[pos]
                if b & 0x80:  # indexed field
                    if b != 0xFF:
                        field = self._entry(b & 0x7F)
                        pos += 1
                    else:
                        index, pos = _integer(block, pos, 7)
                        field = self._entry(index)
                elif b & 0x40:  # literal with incremental indexing
                    field, pos = self._literal(block, pos, 6)
                    self._add(*field)
                elif b & 0x20:  # dynamic table size update
                    limit, pos = _integer(block, pos, 5)
                    if limit > self.max_table:
                        raise ConnectionError_(COMPRESSION_ERROR, "HPACK table size above the limit")
                    self._changed()
                    self.table_limit = limit
                    self._evict()
                    continue
                else:  # literal without indexing / never indexed
                    field, pos = self._literal(block, pos, 4)
                total += len(field[0]) + len(field[1]) + 32
                if total <= self.max_header_list:
                    out.append(field)
        except IndexError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, "truncated HPACK block") from exc
        if total > self.max_header_list:  # only now: the table must see the whole block's inserts
            raise HeaderListTooLarge(f"header list larger than {self.max_header_list} bytes")
        if len(block) <= BLOCK_CACHE_BYTES and changes == self.changes:
            blocks = self.blocks
            if len(blocks) >= BLOCK_CACHE:
                blocks.clear()
            blocks[block] = out
        return out

    def _literal(self, block: bytes, pos: int, prefix: int) -> tuple[tuple[str, str], int]:
        index, pos = _integer(block, pos, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return (name, value), pos


def _integer(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        b = block[pos]
        pos += 1
        value += (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ConnectionError_(COMPRESSION_ERROR, "HPACK integer too large")


huffman_decoded = 0  # Huffman-coded bytes decoded in this process so far (a cached string costs nothing)


def _string(block: bytes, pos: int) -> tuple[str, int]:
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    end = pos + length
    if end > len(block):
        raise ConnectionError_(COMPRESSION_ERROR, "truncated HPACK string")
    raw = block[pos:end]
    if not huffman:
        return raw.decode("latin-1"), end
    text = _huffman_seen.get(raw)
    if text is None:
        global huffman_decoded
        huffman_decoded += length  # (the pure-Python decoder costs ~0.6 us a byte: connection.py charges it)
        try:
            text = decode_huffman(raw).decode("latin-1")
        except Exception as exc:
            raise ConnectionError_(COMPRESSION_ERROR, "bad Huffman string") from exc
        if len(_huffman_seen) >= _HUFFMAN_CACHE:
            _huffman_seen.clear()
        if length <= 256:
            _huffman_seen[raw] = text
    return text, end


# Clients repeat the same literals on every call (nghttp2 never indexes :path), and the
# `hpack` package decodes Huffman bit by bit in Python: remember what short strings decoded to.
_HUFFMAN_CACHE = 1024
_huffman_seen: dict[bytes, str] = {}


# ---- encoding (stateless) ----
def _encode_int(value: int, prefix: int, first: int) -> bytes:
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes([first | value])
    out = bytearray([first | mask])
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_str(s: bytes) -> bytes:
    return _encode_int(len(s), 7, 0) + s


_STATIC_NAME = {name: i + 1 for i, (name, _v) in reversed(list(enumerate(_STATIC)))}
_STATIC_FIELD = {field: i + 1 for i, field in enumerate(_STATIC)}


def encode(headers: list[tuple[str, str]]) -> bytes:
    """A header block of static-table references and literals without indexing."""
    out = []
    for name, value in headers:
        index = _STATIC_FIELD.get((name, value))
        if index:
            out.append(_encode_int(index, 7, 0x80))
            continue
        name_index = _STATIC_NAME.get(name, 0)
        out.append(_encode_int(name_index, 4, 0x00))
        if not name_index:
            out.append(_encode_str(name.encode("latin-1")))
        out.append(_encode_str(value.encode("latin-1")))
    return b"".join(out)
