"""The JSON literals NaN, Infinity and -Infinity, read and written as Triton does.

Triton's HTTP frontend (rapidjson, with its NaN-and-Inf flags) reads these literals in a request's numbers
and writes them for NaN and infinite FP32/FP64 outputs. tritonclient.http sends them for an input holding
NaN or inf (Python's json and rapidjson write them), and reads them back. orjson, which inferd reads and
writes JSON with, refuses the literals and writes NaN and infinities as null, so such a request got 400
and an infinite output came back to the client as NaN. Both slow paths here run only for a document that
holds such a value.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from inferd.worker.wire.errors import invalid_arg

_LITERALS = ("NaN", "Infinity", "-Infinity")
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1


def _int(text: str) -> int | float:
    """An integer as orjson reads it: beyond [-2**63, 2**64) a double (refused beyond a double's range)."""
    if len(text) <= 21:
        value = int(text)
        if _INT_MIN <= value <= _INT_MAX:
            return value
    return _float(text)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: orjson and Triton refuse a number beyond a double's range
        raise ValueError(f"number {text[:32]} is infinity when parsed as double")
    return value


def _check_strings(value: Any) -> None:
    """orjson refuses a lone surrogate (\\ud800); json takes it, and it would fail later as UTF-8."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is str:
            v.encode("utf-8")
        elif type(v) is list:
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v)
            stack.extend(v.values())


def loads(text: Any, error: orjson.JSONDecodeError) -> Any:
    """`text`, which orjson refused with `error`, read again with the non-finite literals when orjson stopped
    at one; otherwise (or if it still does not parse) 400 with orjson's message."""
    pos = error.pos  # in characters; after the sign for "-Infinity" ("no digit after sign")
    # the text up to just past `pos` (at most 4 bytes a character): a refused body is not decoded whole
    head = bytes(memoryview(text)[: 4 * pos + 16]).decode("utf-8", "ignore")
    if head.startswith(_LITERALS, pos) or (head[pos - 1 : pos] == "-" and head.startswith("Infinity", pos)):
        try:
            value = json.loads(bytes(text).decode("utf-8"), parse_int=_int, parse_float=_float)
            _check_strings(value)
            return value
        except (ValueError, RecursionError) as exc:  # (UnicodeEncodeError is a ValueError)
            raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    raise invalid_arg(f"failed to parse the request JSON buffer: {error}")


def has_nonfinite(values: list[float]) -> bool:
    """Whether a list of floats holds NaN or an infinity (the sum is finite for almost every other list)."""
    return not math.isfinite(sum(values)) and not all(map(math.isfinite, values))


def dumps(doc: Any) -> bytes:
    """`doc` as compact UTF-8 JSON with NaN, Infinity and -Infinity written as such."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=True, separators=(",", ":")).encode("utf-8")
