"""The binary tensor data extension (supervisor/http_api/codec.py: `Inference-Header-Content-Length`,
`binary_data_size`, the raw single-input form, shared-memory inputs; templates.py: headers seen before)
against a decoding written here from the protocol's description, and against itself.

Input: `[<model> ]<header value>\\n<body>`: the text before the first newline is the value of the
`Inference-Header-Content-Length` header (latin-1; a leading word and a space name the model, default `m`;
fuzz/targets/_plane.py has the models and shared-memory regions), the rest is the request body.

Checks:
1. Where the codec accepts, the decoding here accepts too, with every input's datatype, shape and bytes the
   same: binary inputs are the body's slices after the JSON header in input order, each of the size its
   shape and datatype give (BYTES: whole length-prefixed elements, as many as the shape holds), and together
   exactly the rest of the body; shared-memory inputs are the region's bytes; header length 0 is the whole
   body as the one input of a single-input model (batch 1, at most one variable dimension).
2. Where the decoding here refuses the framing, the codec refuses; where the document is in the simple form
   the decoding checks in full (id, inputs with binary data or shared memory, outputs with binary_data), the
   codec accepts.
3. A codec that has read the same header over other tensor bytes first (its header template) reads what a
   fresh codec reads; so does the body handed as a bytearray view (a chunked request's body).
"""

from __future__ import annotations

import struct
from typing import Any

import orjson
from _outcome import outcome
from _plane import MODELS, REGIONS, MemoryPlane
from inferd.supervisor.http_api.codec import InferCodec
from inferd.supervisor.inference.limits import MAX_DIMS
from inferd.worker.wire.dtypes import BY_NAME

INSTRUMENT = ("inferd.supervisor.http_api", "inferd.supervisor.inference")
MAX_LEN = 8192
DICT = [b'"binary_data_size"', b'"shared_memory_region"', b'"shared_memory_byte_size"', b'"shared_memory_offset"',
        b'"inputs"', b'"outputs"', b'"binary_data"', b'"parameters"', b'"datatype"', b'"shape"', b'"name"',
        b'"BYTES"', b'"FP16"', b'"BF16"', b'"BOOL"', b'"UINT64"', b'"FP32"', b'"r0"', b'"small"', b"\x00\x00\x00\x00",
        b"\x01\x00\x00\x00", b"\xff\xff\xff\xff", b"text 0\n", b"batched 0\n", b"fixed 0\n", b"two_var 0\n"]

_plane = MemoryPlane()
_LEN = struct.Struct("<I")


class Refused(Exception):
    pass


def _uint(v: Any) -> bool:
    return type(v) is int and 0 <= v < 1 << 64


def _elements(buf: bytes) -> int:
    """How many length-prefixed BYTES elements `buf` holds exactly; Refused if they do not tile it."""
    pos = n = 0
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise Refused("truncated BYTES length")
        pos += 4 + _LEN.unpack_from(buf, pos)[0]
        n += 1
    if pos != len(buf):
        raise Refused("BYTES element overruns")
    return n


def _count(shape: Any) -> int:
    if type(shape) is not list or len(shape) > MAX_DIMS or any(type(d) is not int or d < 0 for d in shape):
        raise Refused("bad shape")
    n = 1
    for d in shape:
        n *= d
    if n >= 1 << 63:
        raise Refused("too many elements")
    return n


def raw(model: str, body: bytes) -> list[tuple[str, str, list[int], bytes]]:
    if model not in MODELS:
        raise Refused("unknown model")
    name, datatype, dims, batch = MODELS[model]
    shape = ([1] if batch else []) + list(dims)
    var = [i for i, d in enumerate(shape) if d < 0]
    if len(var) > 1:
        raise Refused("more than one variable dimension")
    if datatype == "BYTES":
        if any(d != 1 for d in shape):
            raise Refused("BYTES raw input of shape other than [1]")
        return [(name, datatype, shape, _LEN.pack(len(body)) + body)]
    fixed = BY_NAME[datatype].itemsize
    for d in shape:
        if d >= 0:
            fixed *= d
    if var:
        if fixed == 0 or len(body) % fixed:
            raise Refused("raw size does not fit")
        shape[var[0]] = len(body) // fixed
    elif len(body) != fixed:
        raise Refused("raw size mismatch")
    return [(name, datatype, shape, body)]


def decode(model: str, hlen_text: str, body: bytes) -> tuple[list[tuple[str, str, list[int], bytes]], bool]:
    """The binary inputs (name, datatype, shape, bytes) of a request, and whether the document is in the
    simple form checked in full here (then the whole request is valid); Refused for a framing error."""
    t = hlen_text.strip()
    if not (t.isascii() and t.isdigit()) or len(t) > 20 or int(t) > len(body):
        raise Refused("bad header length")
    hlen = int(t)
    if hlen == 0:
        return raw(model, body), True
    try:
        doc = orjson.loads(body[:hlen])
    except orjson.JSONDecodeError:
        raise Refused("header is not JSON") from None
    if type(doc) is not dict or type(doc.get("inputs")) is not list:
        raise Refused("no inputs")
    simple = set(doc) <= {"id", "inputs", "outputs"} and type(doc.get("id", "")) is str
    pos = hlen
    out = []
    names = set()
    for item in doc["inputs"]:
        if type(item) is not dict:
            raise Refused("input is not an object")
        params = item.get("parameters")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        simple = simple and set(item) <= {"name", "datatype", "shape", "parameters"} and type(params) is dict \
            and type(name) is str and 0 < len(name) <= 256 and name not in names
        if type(name) is str:
            names.add(name)
        if type(params) is not dict or "data" in item:
            continue  # JSON data (the json_request target's business) or no source at all
        size = params.get("binary_data_size")
        if size is None:
            region = params.get("shared_memory_region")
            simple = simple and set(params) <= {"shared_memory_region", "shared_memory_byte_size",
                                                "shared_memory_offset"}
            if region is None:
                raise Refused("no source for the input")
            offset, nbytes = params.get("shared_memory_offset", 0), params.get("shared_memory_byte_size")
            if type(region) is not str or region not in REGIONS or not _uint(offset) or not _uint(nbytes) \
                    or offset + nbytes > len(REGIONS[region]):
                raise Refused("bad region")
            data = REGIONS[region][offset:offset + nbytes]
        else:
            simple = simple and set(params) == {"binary_data_size"}
            if "shared_memory_region" in params or not _uint(size) or size > len(body) - pos:
                raise Refused("bad binary_data_size")
            data = body[pos:pos + size]
            pos += size
        if type(datatype) is not str or datatype not in BY_NAME:
            raise Refused("bad datatype")
        count = _count(shape)
        itemsize = BY_NAME[datatype].itemsize
        if itemsize == 0:
            if _elements(data) != count:
                raise Refused("BYTES element count")
        elif count * itemsize != len(data):
            raise Refused("size mismatch")
        out.append((name, datatype, list(shape), data))
    if pos != len(body):
        raise Refused("bytes after the last binary input")
    outputs = doc.get("outputs", [])
    simple = simple and type(outputs) is list and len(outputs) <= 1024 and all(
        type(o) is dict and type(o.get("name")) is str and 0 < len(o["name"]) <= 256
        and set(o) <= {"name", "parameters"} and (
            "parameters" not in o or (type(o["parameters"]) is dict and set(o["parameters"]) <= {"binary_data"}
                                      and type(o["parameters"].get("binary_data", True)) is bool))
        for o in outputs) and len({o["name"] for o in outputs}) == len(outputs) and len(doc["inputs"]) <= 1024
    return out, simple


def _flip(body: bytes, hlen_text: str) -> bytes:
    """The same header over other tensor bytes."""
    t = hlen_text.strip()
    hlen = int(t) if t.isascii() and t.isdigit() and len(t) <= 20 and int(t) <= len(body) else len(body)
    return body[:hlen] + bytes(b ^ 0xA5 for b in body[hlen:])


def test_one_input(data: bytes) -> None:
    line, nl, body = data.partition(b"\n")
    if not nl:
        return
    text = line.decode("latin-1")
    model, _, hlen_text = text.rpartition(" ") if " " in text else ("m", "", text)
    headers = {"inference-header-content-length": hlen_text}
    got = outcome(InferCodec(_plane).parse, model, "", headers, body)
    try:
        want, simple = decode(model, hlen_text, body)
        framing = ""
    except Refused as exc:
        want, simple, framing = [], False, str(exc)
    if got[0] == "ok":
        assert not framing, f"the codec accepts what the decoding refuses ({framing}): {got!r:.600}"
        mine = {name: (dt, shape, bytes(raw)) for name, dt, shape, raw, *_ in got[1][3]}
        for name, dt, shape, raw_ in want:
            assert mine.get(name) == (dt, shape, raw_), (
                f"input {name!r}: the codec reads {mine.get(name)!r:.300}, the decoding {(dt, shape, raw_)!r:.300}")
    else:
        assert not simple or framing, f"the codec refuses a request the decoding accepts in full: {got!r:.400}"
    codec = InferCodec(_plane)
    outcome(codec.parse, model, "", headers, _flip(body, hlen_text))
    for again in (body, memoryview(bytearray(body))):
        seen = outcome(codec.parse, model, "", headers, again)
        assert seen == got, f"after the same header the codec reads {seen!r:.500}\nnot {got!r:.500}"
