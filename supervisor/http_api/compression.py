"""Content-Encoding: inflating request bodies under the body cap, compressing responses."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg


def decode_content(encoding: str | None, body: Any, cap: int) -> Any:
    """Inflate a gzip/deflate body, refusing (413) as soon as the output passes `cap` bytes."""
    if encoding is None:
        return body
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif enc == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise invalid_arg(f"unsupported Content-Encoding '{encoding}'")
    out = bytearray()
    data = memoryview(body).cast("B")
    try:
        while True:
            d = zlib.decompressobj(wbits)
            while data:
                chunk = d.decompress(data, cap + 1 - len(out))
                out += chunk
                if len(out) > cap:
                    raise InferdError(ErrorCode.RESOURCE_EXHAUSTED,
                                      f"decompressed request body exceeds the maximum allowed {cap} bytes")
                data = memoryview(d.unconsumed_tail)
                if not data or d.eof:
                    break
            if not d.eof:
                raise invalid_arg(f"truncated {enc} request body")
            data = memoryview(d.unused_data)
            if not data or enc != "gzip":  # gzip may hold several members
                break
    except zlib.error as exc:
        raise invalid_arg(f"failed to decompress the {enc} request body: {exc}") from None
    return out


def pick_encoding(accept: str | None) -> str | None:
    """The response encoding from Accept-Encoding: the first of gzip/deflate with q > 0."""
    if not accept:
        return None
    for token in accept.split(","):
        name, _, params = token.partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate"):
            continue
        params = params.strip().lower().replace(" ", "")
        if params.startswith("q="):
            try:
                if float(params[2:]) <= 0:
                    continue
            except ValueError:
                continue
        return name
    return None


def encode_content(encoding: str, data: bytes) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    return zlib.compress(data, 6)
