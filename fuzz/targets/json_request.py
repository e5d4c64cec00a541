"""The JSON inference request readers (supervisor/http_api/codec.py with its fast paths json_request.py and
json_template.py) against json and against the codec's general parser.

Input: a request body, or `learnt-body NUL body` (JSON text holds no raw NUL): the codec first reads
`learnt-body` (learning its pattern, when parse_plain takes it), then `body`. Checks, on the body:

1. The codec's document reader (codec._load_doc: orjson, and json_nonfinite for the NaN/Infinity literals
   Triton reads) accepts exactly the documents the standard library's json accepts, and reads the same
   values, modulo the documented rules: numbers beyond a double are refused, integers outside
   [-2**63, 2**64) read as floats (orjson's reading, and rapidjson's), strings with lone surrogates are
   refused, nesting deeper than 1024 is refused (json's own limit is Python's recursion limit).
2. A fresh codec (one-pass reader parse_plain, else the general parser) gives what the general parser alone
   gives: the same request field by field, or the same error (code and message).
3. A codec that read `learnt-body` first (a JSON template) gives the same again, as does the body handed as
   a bytearray (assembled from a chunked request: no templates), and the body read a second time.
Anything else raised by the codec (not an InferdError) is a finding too.
"""

from __future__ import annotations

import json
import math
from typing import Any

from _outcome import outcome
from _plane import MemoryPlane
from inferd.supervisor.http_api import codec as codec_mod
from inferd.supervisor.http_api.codec import InferCodec
from inferd.supervisor.http_api.parsed import ParsedInfer
from inferd.worker.wire.errors import InferdError

INSTRUMENT = ("inferd.supervisor.http_api", "inferd.supervisor.inference")
MAX_LEN = 8192
DICT = [b'"inputs"', b'"outputs"', b'"name"', b'"datatype"', b'"shape"', b'"data"', b'"id"', b'"parameters"',
        b'"binary_data"', b'"FP32"', b'"FP64"', b'"INT8"', b'"INT64"', b'"UINT64"', b'"BOOL"', b'"BYTES"',
        b'"FP16"', b'"UINT8"', b'"INT32"', b'"sequence_id"', b'"priority"', b'"classification"', b"true",
        b"null", b"-0", b"1e308", b"9007199254740993", b"18446744073709551615", b"-9223372036854775808",
        b'"\\u0000"', b'"\\ud800"', b"0.1", b"[]", b"{}", b'"shared_memory_region"', b'"r0"']

_U64 = 1 << 64
_I64 = 1 << 63
_plane = MemoryPlane()


class _Refused(Exception):
    """What orjson refuses by its documented rules (the reference reads such a document as refused)."""


def _int(text: str) -> Any:
    digits = text.lstrip("-")
    if len(digits) <= 20:
        n = int(text)
        if -_I64 <= n < _U64:
            return n
    return _float(text)  # beyond 64 bits: orjson reads a double


def _float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise _Refused("number is infinity when parsed as double")
    return v


def _constant(text: str) -> float:
    return float(text)  # NaN, Infinity, -Infinity: Triton reads them (rapidjson's kParseNanAndInfFlag)


def _no_surrogates(obj: Any) -> None:
    stack = [obj]
    while stack:
        v = stack.pop()
        if type(v) is str:
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                raise _Refused("lone surrogate")
        elif type(v) is list:
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.keys())
            stack.extend(v.values())


def _checked_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Every member, also one a later duplicate key overrides: orjson and rapidjson refuse a lone surrogate
    wherever it stands in the text, not only in the values that survive."""
    for key, value in pairs:
        _no_surrogates(key)
        _no_surrogates(value)
    return dict(pairs)


def reference(body: bytes) -> tuple[str, Any]:
    """("ok", value), ("refused", why) or ("limit", why): json with orjson's documented rules."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant,
                           object_pairs_hook=_checked_object)
        _no_surrogates(value)
        return "ok", value
    except RecursionError:
        return "limit", "nesting deeper than Python's recursion limit"
    except (UnicodeDecodeError, ValueError, _Refused) as exc:  # (JSONDecodeError is a ValueError)
        return "refused", str(exc)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (True is not 1, 0.0 is not -0.0 here)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b and math.copysign(1, a) == math.copysign(1, b) or (a != a and b != b)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def _depth(body: bytes) -> int:
    depth = top = 0
    for c in body:
        if c in b"[{":
            depth += 1
            top = max(top, depth)
        elif c in b"]}":
            depth -= 1
    return top


def reader(body: bytes) -> tuple[str, Any]:
    """What the codec's document reader makes of `body`: ("ok", doc), ("not-object", None), ("refused", why)."""
    try:
        return "ok", codec_mod._load_doc(body)
    except InferdError as exc:
        if "must be a JSON object" in exc.message:
            return "not-object", None
        return "refused", exc.message


def check_document(body: bytes) -> None:
    ref, ref_value = reference(body)
    if ref == "ok" and type(ref_value) is not dict:
        ref, ref_value = "not-object", None
    ours, value = reader(body)
    if ref == "limit" or (ours == "refused" and "recursion" in str(value) and _depth(body) >= 1024):
        return  # nesting limits differ by design
    assert ours == ref, f"the codec's reader: {ours} ({str(value)[:200]}), json: {ref} ({str(ref_value)[:200]})"
    if ours == "ok":
        assert same(value, ref_value), f"the codec read {value!r:.300} where json read {ref_value!r:.300}"


def general(body: bytes) -> tuple[Any, ...]:
    """The codec's general parser alone (no one-pass reader, no templates): the reference for the fast paths."""
    codec = InferCodec(_plane)

    def parse(b: bytes) -> ParsedInfer:
        return codec._parse_doc("m", "", codec_mod._load_doc(b), b, -1, len(b))

    return outcome(parse, body)


def test_one_input(data: bytes) -> None:
    learnt, sep, body = data.partition(b"\0")
    if not sep:
        learnt = body = data
    check_document(body)
    want = general(body)
    fresh = outcome(InferCodec(_plane).parse, "m", "", {}, body)
    assert fresh == want, f"a fresh codec reads {fresh!r:.400}\nthe general parser {want!r:.400}"
    codec = InferCodec(_plane)
    outcome(codec.parse, "m", "", {}, learnt)
    for again in (body, body, bytearray(body)):
        got = outcome(codec.parse, "m", "", {}, again)
        assert got == want, f"after learning {learnt[:200]!r} the codec reads {got!r:.400}\nnot {want!r:.400}"
