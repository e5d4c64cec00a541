"""Triton's pure-Python datatype helpers, same names and behaviour: type tables and conversions, and
the length-prefixed serialization of BYTES tensors."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..wire import bytes_codec, dtypes
from ._pb_base import TritonModelException

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_NUMBER_TO_NUMPY = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed serialization of an object/bytes array (C order); `()` for an empty array,
    None for other dtypes (as Triton's helper)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        return bytes_codec.serialize(input_tensor)
    return None


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """1-D object array of `bytes` from a length-prefixed buffer."""
    if isinstance(encoded_tensor, np.ndarray) and encoded_tensor.dtype == np.object_:
        encoded_tensor = encoded_tensor.reshape(-1)[0] if encoded_tensor.size else b""
    try:
        return bytes_codec.deserialize(encoded_tensor)
    except Exception as exc:
        raise TritonModelException(getattr(exc, "message", str(exc))) from None


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> Optional[int]:
    if data_type is np.object_ or data_type is np.bytes_:
        return 13
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in ("O", "S"):
        return 13
    if dt.kind == "U":
        return None
    found = dtypes.from_numpy(dt)
    return found.config_number if found is not None and found.numpy is not None else None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]

