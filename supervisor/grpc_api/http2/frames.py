"""HTTP/2 frames (RFC 9113 §4, §6): the numbers, and builders for the frames a server sends."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1

HEAD = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id (R bit included)
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class ConnectionError_(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def header(length: int, ftype: int, flags: int, stream_id: int) -> bytes:
    return HEAD.pack(length >> 8, length & 0xFF, ftype, flags, stream_id)


def parse_header(buf: bytes | memoryview, pos: int) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the 9-byte frame header at `pos`."""
    hi, lo, ftype, flags, sid = HEAD.unpack_from(buf, pos)
    return (hi << 8) | lo, ftype, flags, sid & 0x7FFFFFFF


def settings(values: dict[int, int]) -> bytes:
    body = b"".join(_SETTING.pack(k, v) for k, v in values.items())
    return header(len(body), SETTINGS, 0, 0) + body


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


SETTINGS_ACK = header(0, SETTINGS, ACK, 0)


def ping(opaque: bytes) -> bytes:
    return header(8, PING, 0, 0) + opaque


def ping_ack(opaque: bytes) -> bytes:
    return header(8, PING, ACK, 0) + opaque


def window_update(stream_id: int, increment: int) -> bytes:
    return header(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def rst_stream(stream_id: int, code: int) -> bytes:
    return header(4, RST_STREAM, 0, stream_id) + _U32.pack(code)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return header(8 + len(debug), GOAWAY, 0, 0) + _U32.pack(last_stream_id) + _U32.pack(code) + debug


def u32(payload: bytes | memoryview) -> int:
    return int(_U32.unpack_from(payload, 0)[0])
