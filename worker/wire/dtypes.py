"""The one datatype table: protocol name <-> config enum name <-> numpy dtype <-> element size.

BYTES elements are variable-size (size 0 here); BF16 has no numpy dtype (raw bytes, viewed as uint16
where a numpy view is needed).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class DataType(NamedTuple):
    name: str  # protocol string, e.g. "FP32"
    config_name: str  # model_config enum name, e.g. "TYPE_FP32"
    config_number: int  # model_config enum number
    numpy: np.dtype | None  # little-endian numpy dtype, None for BF16
    itemsize: int  # bytes per element, 0 for BYTES


_TABLE = [
    DataType("BOOL", "TYPE_BOOL", 1, np.dtype(np.bool_), 1),
    DataType("UINT8", "TYPE_UINT8", 2, np.dtype("<u1"), 1),
    DataType("UINT16", "TYPE_UINT16", 3, np.dtype("<u2"), 2),
    DataType("UINT32", "TYPE_UINT32", 4, np.dtype("<u4"), 4),
    DataType("UINT64", "TYPE_UINT64", 5, np.dtype("<u8"), 8),
    DataType("INT8", "TYPE_INT8", 6, np.dtype("<i1"), 1),
    DataType("INT16", "TYPE_INT16", 7, np.dtype("<i2"), 2),
    DataType("INT32", "TYPE_INT32", 8, np.dtype("<i4"), 4),
    DataType("INT64", "TYPE_INT64", 9, np.dtype("<i8"), 8),
    DataType("FP16", "TYPE_FP16", 10, np.dtype("<f2"), 2),
    DataType("FP32", "TYPE_FP32", 11, np.dtype("<f4"), 4),
    DataType("FP64", "TYPE_FP64", 12, np.dtype("<f8"), 8),
    DataType("BYTES", "TYPE_STRING", 13, np.dtype(np.object_), 0),
    DataType("BF16", "TYPE_BF16", 14, None, 2),
]

BY_NAME: dict[str, DataType] = {d.name: d for d in _TABLE}
BY_CONFIG_NAME: dict[str, DataType] = {d.config_name: d for d in _TABLE}
BY_CONFIG_NUMBER: dict[int, DataType] = {d.config_number: d for d in _TABLE}


_BY_DTYPE: dict[np.dtype, DataType] = {}  # from_numpy's answers (fixed-size dtypes only: bounded)


def from_numpy(dtype: np.dtype) -> DataType | None:
    """Protocol datatype of a numpy dtype (object, bytes_ and str_ arrays are BYTES)."""
    try:
        return _BY_DTYPE[dtype]
    except (KeyError, TypeError):
        pass
    dtype = np.dtype(dtype)
    found = _BY_DTYPE.get(dtype)
    if found is not None:
        return found
    found = _from_numpy(dtype)
    if found is not None and dtype.kind not in ("S", "U") and len(_BY_DTYPE) < 64:
        _BY_DTYPE[dtype] = found
    return found


def _from_numpy(dtype: np.dtype) -> DataType | None:
    if dtype.kind in ("O", "S", "U"):
        return BY_NAME["BYTES"]
    if dtype.name == "bfloat16":
        return BY_NAME["BF16"]
    for d in _TABLE:
        if d.numpy is not None and d.numpy.kind != "O" and d.numpy == dtype.newbyteorder("<"):
            return d
    return None


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
