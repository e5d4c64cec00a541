"""The BYTES tensor codec (worker/wire/bytes_codec.py) and the one datatype table (worker/wire/dtypes.py).

Reference: Triton's BYTES layout read by a parser written here (each element a 4-byte little-endian length,
then that many bytes, nothing left over). `deserialize` must give the same elements or refuse with
InferdError(INVALID_ARG), never another exception, with and without an expected element count; what it
accepts, `serialize` writes back byte for byte. `dtypes.from_numpy` (cached) must answer as the uncached
lookup and agree with the table.

Data: one mode byte, then
- 0: a BYTES tensor's bytes as sent (seeds: BYTES inputs captured from a real server, fuzz/seeds/wire_seeds.py),
  an expected count from the last byte;
- 1: elements built from the bytes (bytes, str with any code point but lone surrogates, numbers), serialized
  as an object array, a bytes_ array or a str_ array, then read back.
"""

from __future__ import annotations

import struct

import numpy as np
from _fdp import FDP, provider
from inferd.worker.wire import bytes_codec, dtypes
from inferd.worker.wire.errors import ErrorCode, InferdError


class Finding(AssertionError):
    pass


def reference(buf: bytes) -> list[bytes] | None:
    """The elements of `buf`, or None where the layout is broken."""
    out, pos = [], 0
    while pos < len(buf):
        if len(buf) - pos < 4:
            return None
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if n > len(buf) - pos:
            return None
        out.append(buf[pos:pos + n])
        pos += n
    return out


def read(buf: object, count: int | None) -> list[bytes] | None:
    try:
        arr = bytes_codec.deserialize(buf, count, "IN")
    except InferdError as exc:
        if exc.code != ErrorCode.INVALID_ARG or "'IN'" not in exc.message:
            raise Finding(f"refused with {exc!r}, not INVALID_ARG naming the tensor") from None
        return None
    if arr.dtype != np.object_ or arr.ndim != 1 or not all(type(x) is bytes for x in arr):
        raise Finding(f"deserialize gave {arr!r}")
    return list(arr)


def check_buffer(buf: bytes, hint: int) -> None:
    want = reference(buf)
    for source in (buf, bytearray(buf), memoryview(buf), np.frombuffer(buf, np.uint8)):
        got = read(source, None)
        if got != want:
            raise Finding(f"deserialize {got!r} != reference {want!r} for {buf[:200]!r}")
    for count in {0, hint, len(want) if want is not None else hint}:
        got = read(buf, count)
        expect = want if want is not None and len(want) == count else None
        if got != expect:
            raise Finding(f"deserialize(count={count}) {got!r} != {expect!r} for {buf[:200]!r}")
    if want is not None:
        again = bytes_codec.serialize(np.array(want + [b""], dtype=np.object_)[:-1])
        if again != buf:
            raise Finding(f"serialize(deserialize(x)) != x: {again[:200]!r} != {buf[:200]!r}")
        if bytes_codec.count_elements(buf) != len(want):
            raise Finding("count_elements disagrees")


_TEXT = ["", "a", "é", "☃", "\U0001f600", "\x00", "\n", "\udcff", "x" * 300]
_DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64, np.float16,
           np.float32, np.float64, np.object_, np.complex64, ">i4", ">f8", "<u2", "S3", "U2", "V4", np.longdouble]


def element(fdp: FDP) -> object:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
    if kind == 1:
        return "".join(fdp.PickValueInList(_TEXT) for _ in range(fdp.ConsumeIntInRange(0, 3)))
    if kind == 2:
        return fdp.ConsumeIntInRange(-(1 << 63), (1 << 63) - 1)
    return fdp.PickValueInList([1.5, -0.0, True, None])


def encoded(item: object) -> bytes:
    """An element as Triton's clients write it: bytes as they are, str as UTF-8, anything else as its str()."""
    if isinstance(item, bytes):
        return item
    text = item if isinstance(item, str) else str(item)
    return text.encode("utf-8", "surrogatepass" if isinstance(item, str) else "strict")


def structured(fdp: FDP) -> None:
    items = [element(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    shape = (len(items),) if fdp.ConsumeBool() or len(items) % 2 else (2, len(items) // 2)
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    arr = arr.reshape(shape)
    try:
        raw = bytes_codec.serialize(arr)
    except UnicodeEncodeError:
        if any(isinstance(x, str) and "\udcff" in x for x in items):
            return  # a str holding a lone surrogate has no UTF-8 form: serialize refuses it, as Triton's client
        raise
    want = [encoded(x) for x in items]
    if reference(raw) != want:
        raise Finding(f"serialize({items!r}) wrote {raw[:200]!r}")
    check_buffer(raw, len(items))
    texts = [x for x in items if isinstance(x, bytes) and not x.endswith(b"\x00")]
    if texts:  # a bytes_ array (numpy drops trailing NULs of its items, as for every such array)
        raw = bytes_codec.serialize(np.array(texts, dtype=np.bytes_))
        if reference(raw) != texts:
            raise Finding(f"serialize of a bytes_ array wrote {raw[:200]!r}")
    dtype = np.dtype(fdp.PickValueInList(_DTYPES))
    cached, uncached = dtypes.from_numpy(dtype), dtypes._from_numpy(dtype)
    if cached != uncached:
        raise Finding(f"from_numpy({dtype}) {cached} != uncached {uncached}")
    if cached is not None and cached.numpy is not None and cached.name != "BYTES":
        if cached.numpy != dtype.newbyteorder("<") or dtypes.BY_NAME[cached.name] is not cached:
            raise Finding(f"from_numpy({dtype}) gave {cached}")
        if cached.itemsize != dtype.itemsize:
            raise Finding(f"{cached.name}: itemsize {cached.itemsize} != {dtype.itemsize}")


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        check_buffer(data[1:], data[-1] % 8)
    else:
        structured(provider(data[1:]))
