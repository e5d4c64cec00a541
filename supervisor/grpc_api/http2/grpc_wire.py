"""gRPC's framing on HTTP/2 (the gRPC "PROTOCOL-HTTP2" spec): status codes, the 5-byte length prefix
of messages (Deframer, with gzip / deflate messages), trailers with a percent-encoded grpc-message, and
grpc-timeout values."""

from __future__ import annotations

import re
import struct
import zlib
from typing import Any

import grpc

from .hpack_codec import encode

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
INTERNAL = 13
UNAVAILABLE = 14
UNIMPLEMENTED = 12
RESOURCE_EXHAUSTED = 8

MESSAGE_PREFIX = struct.Struct(">BI")
MAX_MESSAGE_LIMIT = 2**31 - 1  # the largest message gRPC's length prefix (and Triton) allow
RESPONSE_HEAD = encode(
    [(":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", "identity,deflate,gzip")]
)
TRAILERS_OK = encode([("grpc-status", "0")])
MAX_MESSAGE_CHARS = 4096
_TIMEOUT = re.compile(r"^(\d{1,8})([HMSmun])$")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class Abort(grpc.aio.AbortError):
    """A handler's `context.abort(...)`: ends the call with this status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__()
        self.code = code
        self.message = message


def status_of_code(code: Any) -> int:
    """grpc.StatusCode -> its number (handlers abort with grpc.StatusCode values)."""
    return int(code.value[0]) if isinstance(code, grpc.StatusCode) else int(code)


def _percent(message: str) -> str:
    data = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in data):
        return message
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in data)


def trailers(code: int, message: str = "") -> bytes:
    if code == OK and not message:
        return TRAILERS_OK
    fields = [("grpc-status", str(code))]
    if message:
        if len(message) > MAX_MESSAGE_CHARS:  # clients refuse trailers above ~16 KiB: keep errors readable
            message = message[:MAX_MESSAGE_CHARS] + "... (truncated)"
        fields.append(("grpc-message", _percent(message)))
    return encode(fields)


def trailers_only(code: int, message: str) -> bytes:
    return RESPONSE_HEAD + trailers(code, message)


def parse_timeout(value: str) -> float | None:
    m = _TIMEOUT.match(value)
    return int(m.group(1)) * _UNITS[m.group(2)] if m else None


def frame_message(message: bytes | memoryview) -> list[Any]:
    return [MESSAGE_PREFIX.pack(0, len(message)), message]


def single_message(data: memoryview, max_size: int) -> bytes | None:
    """`data` as exactly one uncompressed message within `max_size`: the message, as a fresh Deframer's
    `feed` gives it. Else None: feed it to a Deframer."""
    if len(data) < 5 or data[0]:
        return None
    length = MESSAGE_PREFIX.unpack_from(data)[1]
    if length + 5 != len(data) or length > max_size:
        return None
    return bytes(data[5:])


class Deframer:
    """Length-prefixed messages out of DATA payloads; each message's size is checked before it is kept.

    A message inside one payload is copied out once; one spread over many payloads (a big tensor) is
    appended to a bytearray as it arrives, so it is copied once too, never joined at the end."""

    __slots__ = ("head", "body", "need", "flag", "max_size", "encoding")

    def __init__(self, max_size: int, encoding: str | None) -> None:
        self.head = b""  # a prefix split over payloads
        self.body: bytearray | None = None  # a message split over payloads
        self.need = 5
        self.flag = -1  # compressed flag of the message being read; -1 = reading a prefix
        self.max_size = max_size
        self.encoding = encoding

    def feed(self, data: memoryview) -> list[bytes | bytearray]:
        out: list[bytes | bytearray] = []
        while data:
            if self.flag < 0:
                if not self.head and len(data) >= 5:
                    prefix: bytes | memoryview = data[:5]
                    data = data[5:]
                else:
                    take = 5 - len(self.head)
                    self.head += bytes(data[:take])
                    data = data[take:]
                    if len(self.head) < 5:
                        break
                    prefix, self.head = self.head, b""
                self._prefix(prefix)
                if self.need == 0:
                    out.append(self._message(b""))
                continue
            body = self.body
            if body is None:
                n = self.need
                if len(data) >= n:
                    out.append(self._message(bytes(data[:n])))
                    data = data[n:]
                    continue
                body = self.body = bytearray()
            take = self.need - len(body)
            body += data[:take]
            data = data[take:]
            if len(body) == self.need:
                self.body = None
                out.append(self._message(body))
        return out

    def _prefix(self, prefix: bytes | memoryview) -> None:
        flag, length = MESSAGE_PREFIX.unpack(prefix)
        if length > self.max_size:
            raise Abort(
                RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {self.max_size})"
            )
        self.flag = flag
        self.need = length

    def _message(self, body: bytes | bytearray) -> bytes | bytearray:
        flag = self.flag
        self.flag = -1
        self.need = 5
        if not flag:
            return body
        if self.encoding in ("gzip", "deflate"):
            return _decompress(body, self.encoding, self.max_size)
        raise Abort(INTERNAL, "compressed message without a grpc-encoding")

    @property
    def idle(self) -> bool:
        return self.flag < 0 and not self.head

    @property
    def buffered(self) -> int:
        """Bytes of a message not yet complete."""
        return len(self.body) if self.body is not None else 0


def _decompress(body: bytes | bytearray, encoding: str, limit: int) -> bytes:
    d = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise Abort(INTERNAL, f"cannot decompress the message ({encoding}): {exc}") from exc
    if len(out) > limit or d.unconsumed_tail:
        raise Abort(RESOURCE_EXHAUSTED, f"decompressed message larger than max ({limit})")
    if not d.eof:
        raise Abort(INTERNAL, f"cannot decompress the message ({encoding}): truncated")
    return out
