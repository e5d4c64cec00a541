"""Triton's BYTES tensor layout: each element is a 4-byte little-endian length then its raw bytes."""

from __future__ import annotations

import struct

import numpy as np

from .errors import invalid_arg

_LEN = struct.Struct("<I")


def serialize(array: np.ndarray) -> bytes:
    """Serialize an object/bytes/str array (row-major) into the length-prefixed layout."""
    parts = []
    for item in array.reshape(-1).tolist() if array.size else []:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize(buf, count: int | None = None, name: str = "") -> np.ndarray:
    """Decode a length-prefixed buffer into a 1-D object array of bytes.

    With `count`, the buffer must hold exactly that many elements (the check that keeps a client from
    declaring one shape and sending another); errors name the tensor.
    """
    view = memoryview(buf).cast("B")
    total = len(view)
    items: list[bytes] = []
    pos = 0
    while pos < total:
        if count is not None and len(items) >= count:
            raise invalid_arg("unexpected additional data for BYTES input '%s'" % name)
        if pos + 4 > total:
            raise invalid_arg("truncated length prefix in BYTES tensor '%s'" % name)
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > total:
            raise invalid_arg("BYTES element of %d bytes overruns tensor '%s'" % (n, name))
        items.append(bytes(view[pos : pos + n]))
        pos += n
    if count is not None and len(items) != count:
        raise invalid_arg(
            "expected %d BYTES elements for tensor '%s', got %d" % (count, name, len(items))
        )
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def count_elements(buf) -> int:
    """Number of well-formed elements in a buffer (raises INVALID_ARG on bad framing)."""
    return len(deserialize(buf))
