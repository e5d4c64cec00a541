"""Arguments of the pb_utils classes and functions, taken as python_backend's pybind11 bindings take them.

Triton declares them as C++ types; pybind11 converts what a model passes: a `std::string` takes str
(numpy.str_ too) or bytes (numpy.bytes_ too, as `as_numpy()` of a BYTES tensor gives them); a
`std::vector<std::string>` any sequence of those but a str or bytes itself (list, tuple, 1-d numpy
array); an integer any int or object with `__index__` (numpy integers), never a float, and only within
the C++ type's range. Anything else is a TypeError naming the argument, as pybind11 refuses it.
Runs on Python 3.9+ with numpy only.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)


def text(value: Any, what: str) -> str:
    """A `std::string` argument as a str (bytes are read as UTF-8)."""
    if isinstance(value, str):
        return str(value)  # a plain str, also from numpy.str_
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError("%s: %r is not UTF-8 text" % (what, bytes(value)[:64])) from None
    raise TypeError("%s must be str or bytes, got %s" % (what, type(value).__name__))


def texts(value: Any, what: str) -> list[str]:
    """A `std::vector<std::string>` argument: a list, tuple or 1-d array of str or bytes."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise TypeError("%s must be a 1-d sequence of names, got an array of shape %s" % (what, value.shape))
        items: Sequence[Any] = value.tolist()
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        items = value
    else:
        raise TypeError("%s must be a list or tuple of str or bytes, got %s" % (what, type(value).__name__))
    return [text(item, "%s[%d]" % (what, i)) for i, item in enumerate(items)]


def integer(value: Any, what: str, bounds: tuple[int, int] = INT64) -> int:
    """An integer argument of a C++ type with `bounds` (inclusive)."""
    if isinstance(value, (float, np.floating)):
        raise TypeError("%s must be an integer, got %s" % (what, type(value).__name__))
    try:
        number = operator.index(value)  # int, bool, numpy integers
    except TypeError:
        raise TypeError("%s must be an integer, got %s" % (what, type(value).__name__)) from None
    if not bounds[0] <= number <= bounds[1]:
        raise TypeError("%s must lie in [%d, %d], got %d" % (what, bounds[0], bounds[1], number))
    return number


def correlation_id(value: Any) -> Any:
    """An unsigned 64-bit integer or a str (Triton: 'Correlation ID must be integer or string')."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (float, np.floating, bytes, bytearray)):
        return None
    try:
        number = operator.index(value)
    except TypeError:
        return None
    return number if UINT64[0] <= number <= UINT64[1] else None


class Missing:
    """The default of an argument python_backend declares without one (pybind11 then requires it)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = Missing()


def incompatible(function: str, signature: str, args: tuple = (), kwargs: dict | None = None) -> TypeError:
    """The TypeError pybind11 raises when no overload takes the arguments, worded as python_backend's
    bindings word it (`signature` is the one overload, e.g. "(message: str) -> None")."""
    kind = "constructor" if function == "__init__" else "function"
    shown = ", ".join(repr(a) for a in args)
    if kwargs:
        shown += ("; " if shown else "") + "kwargs: " + ", ".join("%s=%r" % kv for kv in kwargs.items()
                                                                     if kv[1] is not REQUIRED)
    return TypeError("%s(): incompatible %s arguments. The following argument types are supported:\n    1. %s\n\n"
                     "Invoked with: %s" % (function, kind, signature, shown))
