"""Tensor helpers shared by the HTTP and gRPC frontends (framework-free: numpy and the wire only).

Everything a client declares (shape, datatype, element counts, BYTES framing) is checked here before
anything is allocated from it. Raw tensor bytes are the wire form: little-endian, row-major, BOOL one
byte, BYTES elements as a 4-byte little-endian length followed by the bytes.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import Any

import numpy as np
from inferd.worker.wire.dtypes import BY_NAME, DataType
from inferd.worker.wire.errors import internal, invalid_arg

from .limits import MAX_DIMS

INT64_MAX = (1 << 63) - 1
_LEN = struct.Struct("<I")

# array-module typecodes of the numeric datatypes (little-endian hosts only: the wire is little-endian).
# For the short `data` lists of a typical JSON request, array packs and unpacks ~5x cheaper than numpy.
ARRAY_CODES = {name: code for name, code in (
    ("FP32", "f"), ("FP64", "d"), ("INT8", "b"), ("INT16", "h"), ("INT32", "i"), ("INT64", "q"),
    ("UINT8", "B"), ("UINT16", "H"), ("UINT32", "I"), ("UINT64", "Q"),
) if sys.byteorder == "little" and array.array(code).itemsize == BY_NAME[name].itemsize}
_EXACT_INT = 1 << 53  # ints up to this size convert to a float exactly, as numpy's int64 path does
_EXACT_LO = -_EXACT_INT
_NUMBER_TYPES = frozenset((float, int))
_INT_TYPE = {int}
_FLOAT_TYPE = {float}


def datatype_of(datatype: Any, name: str) -> DataType:
    dt = BY_NAME.get(datatype) if isinstance(datatype, str) else None
    if dt is None:
        raise invalid_arg(f"invalid datatype '{datatype}' for tensor '{name}'")
    return dt


def _checked_count(shape: Any, name: str, max_dims: int) -> int:
    if not isinstance(shape, (list, tuple)):
        raise invalid_arg(f"shape of tensor '{name}' must be an array of integers")
    if len(shape) > max_dims:
        raise invalid_arg(f"tensor '{name}' has {len(shape)} dimensions, at most {max_dims} are allowed")
    count = 1
    for d in shape:
        if type(d) is not int:  # bool and float are refused too
            raise invalid_arg(f"shape of tensor '{name}' must be an array of integers, got {list(shape)!r}")
        if d < 0:
            raise invalid_arg(f"tensor '{name}' has a negative dimension in shape {list(shape)}")
        count *= d
    if count > INT64_MAX:
        raise invalid_arg(f"shape {list(shape)} of tensor '{name}' holds too many elements")
    return count


def validate_shape(shape: Any, name: str, max_dims: int = MAX_DIMS) -> list[int]:
    """A list of non-negative integer dims whose element count fits in int64."""
    _checked_count(shape, name, max_dims)
    return list(shape)


def element_count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shape_info(datatype: Any, shape: Any, name: str,
               max_dims: int = MAX_DIMS) -> tuple[DataType, list[int], int, int | None]:
    """Validate a declared tensor once: (datatype, shape, element count, byte size or None for BYTES)."""
    dt = datatype_of(datatype, name)
    count = _checked_count(shape, name, max_dims)
    if dt.itemsize == 0:
        return dt, list(shape), count, None
    n = count * dt.itemsize
    if n > INT64_MAX:
        raise invalid_arg(f"shape {list(shape)} of tensor '{name}' is too large for datatype {dt.name}")
    return dt, list(shape), count, n


def expected_nbytes(datatype: str, shape: Any, name: str = "") -> int | None:
    """Byte size of a fixed-size tensor (None for BYTES); refuses shapes that overflow int64."""
    return shape_info(datatype, shape, name)[3]


def check_bytes_framing(buf: Any, count: int, name: str) -> None:
    """Walk BYTES length prefixes: exactly `count` elements, none overrunning the buffer. No copies."""
    view = memoryview(buf).cast("B")
    total = len(view)
    pos = 0
    seen = 0
    unpack = _LEN.unpack_from
    while pos < total:
        if seen >= count:
            raise invalid_arg(f"unexpected additional data for BYTES tensor '{name}': "
                              f"expected {count} elements")
        if pos + 4 > total:
            raise invalid_arg(f"truncated length prefix in BYTES tensor '{name}'")
        pos += 4 + unpack(view, pos)[0]
        if pos > total:
            raise invalid_arg(f"BYTES element overruns the data of tensor '{name}'")
        seen += 1
    if seen != count:
        raise invalid_arg(f"expected {count} elements in BYTES tensor '{name}', got {seen}")


def bytes_elements(buf: Any, count: int, name: str) -> list[bytes]:
    """Split BYTES wire data into its elements (framing checked as in check_bytes_framing)."""
    check_bytes_framing(buf, count, name)
    view = memoryview(buf).cast("B")
    out = []
    pos = 0
    for _ in range(count):
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        out.append(bytes(view[pos:pos + n]))
        pos += n
    return out


def pack_bytes(items: list[bytes]) -> bytes:
    parts = []
    for item in items:
        parts.append(_LEN.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _flatten(data: Any, name: str, max_depth: int) -> list[Any]:
    """Row-major flattening of nested JSON arrays without recursion, depth-capped."""
    if not isinstance(data, list):
        raise invalid_arg(f"'data' of tensor '{name}' must be an array")
    if not data or not isinstance(data[0], list):
        return data  # flat (a stray nested list is caught by the element checks)
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= max_depth:
                    raise invalid_arg(f"'data' of tensor '{name}' is nested too deeply")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def json_to_raw(datatype: str, shape: list[int], data: Any, name: str = "",
                max_depth: int = MAX_DIMS) -> bytes:
    """JSON `data` (flat or nested, row-major) into wire bytes, checked against shape and datatype."""
    dt = datatype_of(datatype, name)
    count = element_count(validate_shape(shape, name))
    return pack_json(dt, shape, count, data, name, max_depth)


def pack_plain(code: str, flat: list[Any]) -> bytes | None:
    """`flat` packed with the array module (typecode `code`) when that gives exactly numpy's bytes:
    only floats and exactly convertible ints for FP32/FP64, only in-range ints for integer types;
    else None."""
    types = set(map(type, flat))  # one C-level pass; bools and anything else go the numpy way
    if code in "fd":
        if types == _FLOAT_TYPE:
            return array.array(code, flat).tobytes()
        if not types <= _NUMBER_TYPES or not _EXACT_LO <= min(flat) <= max(flat) <= _EXACT_INT:
            return None
    elif types != _INT_TYPE:
        return None
    try:
        return array.array(code, flat).tobytes()
    except OverflowError:  # out of range: numpy's path reports it
        return None


def pack_json(dt: DataType, shape: list[int], count: int, data: Any, name: str = "",
              max_depth: int = MAX_DIMS) -> bytes:
    """`json_to_raw` for a datatype and shape already checked (`shape_info`); `count` elements."""
    flat = _flatten(data, name, max_depth)
    if len(flat) != count:
        raise invalid_arg(f"unexpected number of elements for tensor '{name}': shape {list(shape)} needs "
                          f"{count}, got {len(flat)}")
    code = ARRAY_CODES.get(dt.name)  # the common case first: numbers of a numeric type
    if code is not None and flat:
        packed = pack_plain(code, flat)
        if packed is not None:
            return packed
    if dt.name == "BYTES":
        items = []
        for v in flat:
            if isinstance(v, str):
                items.append(v.encode("utf-8"))
            else:
                raise invalid_arg(f"BYTES tensor '{name}' expects JSON strings, got {type(v).__name__}")
        return pack_bytes(items)
    if dt.name in ("FP16", "BF16"):
        raise invalid_arg(f"receiving {dt.name} data via JSON is not supported. Please use the binary data "
                          f"format for input {name}")
    assert dt.numpy is not None
    if not flat:
        return b""
    try:
        arr = np.array(flat)
    except (ValueError, TypeError, OverflowError):
        arr = np.array([None])  # ragged or exotic: reported below as a type error
    kind = arr.dtype.kind
    want = dt.numpy.kind
    if want in "iu" and kind in "fO" and arr.ndim == 1 and all(type(v) in (int, bool) for v in flat):
        # integers beyond int64 made numpy guess float/object: convert exactly, range-checked
        if min(flat) < np.iinfo(dt.numpy).min or max(flat) > np.iinfo(dt.numpy).max:
            raise invalid_arg(f"a value of tensor '{name}' is out of range for datatype {dt.name}")
        return np.array(flat, dtype=dt.numpy).tobytes()
    ok = arr.ndim == 1 and (
        (want == "b" and kind == "b")
        or (want in "iu" and kind in "iu")
        or (want == "f" and kind in "iuf")
    )
    if not ok:
        expect = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers"}[want]
        raise invalid_arg(f"tensor '{name}' of datatype {dt.name} expects JSON {expect}")
    if want in "iu":
        info = np.iinfo(dt.numpy)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise invalid_arg(f"a value of tensor '{name}' is out of range for datatype {dt.name}")
    return arr.astype(dt.numpy, copy=False).tobytes()


def raw_to_json(datatype: str, shape: list[int], data: Any, name: str = "") -> list[Any]:
    """Wire bytes into a flat JSON list. BYTES elements become strings (they must be valid UTF-8);
    FP16/BF16 are refused as Triton does (binary data only)."""
    dt = datatype_of(datatype, name)
    count = element_count(shape)
    if dt.name == "BYTES":
        out = []
        for item in bytes_elements(data, count, name):
            try:
                out.append(item.decode("utf-8"))
            except UnicodeDecodeError:
                raise invalid_arg(f"output '{name}' holds bytes that are not valid UTF-8; request it as "
                                  "binary data") from None
        return out
    view = memoryview(data).cast("B")
    if len(view) != count * dt.itemsize:
        raise internal(f"output '{name}' holds {len(view)} bytes, shape {list(shape)} of {dt.name} "
                       f"needs {count * dt.itemsize}")
    if dt.name in ("FP16", "BF16"):
        raise invalid_arg(f"sending {dt.name} data via JSON is not supported. Please use the binary data "
                          f"format for output {name}")
    assert dt.numpy is not None
    code = ARRAY_CODES.get(dt.name)
    if code is not None:
        return view.cast(code).tolist()  # type: ignore[call-overload]  # numpy tolist()'s numbers, cheaper
    return np.frombuffer(view, dtype=dt.numpy).tolist()  # type: ignore[no-any-return]
