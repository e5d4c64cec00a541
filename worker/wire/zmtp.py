"""ZeroMQ's wire protocol (ZMTP 3.0, NULL mechanism) for both ends of the worker link.

Neither end runs a ZeroMQ I/O thread on the hot path: the supervisor speaks ZMTP on its event loop like
a ROUTER (instances/channel.py), and a worker's main socket speaks it on a blocking Unix socket like a
DEALER (worker/zmtp_socket.py). A message then costs one socket write and wakes its reader directly,
instead of crossing two I/O threads. Other libzmq sockets (the worker's heartbeat and BLS sockets) still
talk to the supervisor over the same endpoint: it is ZMTP on both sides (RFC 23/ZMTP: greeting, READY
handshake, frames of flags + size + body).

`Reader` turns received bytes into frames with no copy where a frame lies inside one read; `encode`
turns a message into the pieces to write.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

MORE = 0x01
LONG = 0x02
COMMAND = 0x04

# signature (0xFF, 8 bytes padding, 0x7F), version 3.0, mechanism "NULL", as-server 0, filler
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
GREETING_SIZE = 64
COMPATIBLE_PEERS = frozenset((b"DEALER", b"REQ", b"ROUTER"))  # socket types a ROUTER talks to
_SPLIT_COPY_MAX = 64 * 1024  # a frame split across reads and smaller than this is joined by copying
_JOIN_MAX = 64 * 1024  # outgoing frames smaller than this are copied into one write; larger ones are not
_LONG_SIZE = LONG_SIZE = struct.Struct(">Q")


class ProtocolViolation(Exception):
    """The peer broke ZMTP (bad greeting, oversized frame, malformed command): drop the connection."""


def command(name: bytes, body: bytes = b"") -> bytes:
    payload = bytes((len(name),)) + name + body
    return frame_header(COMMAND, len(payload)) + payload


def ready(socket_type: bytes, identity: bytes = b"") -> bytes:
    props = _property(b"Socket-Type", socket_type)
    if identity:
        props += _property(b"Identity", identity)
    return command(b"READY", props)


def _property(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + struct.pack(">I", len(value)) + value


def parse_command(body: memoryview) -> tuple[bytes, memoryview]:
    if len(body) < 1 or len(body) < 1 + body[0]:
        raise ProtocolViolation("malformed command")
    end = 1 + body[0]
    return bytes(body[1:end]), body[end:]


def parse_properties(data: memoryview) -> dict[bytes, bytes]:
    props: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        size = data[pos]
        name = bytes(data[pos + 1:pos + 1 + size])
        pos += 1 + size
        if pos + 4 > len(data):
            raise ProtocolViolation("malformed READY property")
        (vsize,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if pos + vsize > len(data):
            raise ProtocolViolation("malformed READY property")
        props[name.lower()] = bytes(data[pos:pos + vsize])
        pos += vsize
    return props


def check_greeting(greeting: bytes) -> None:
    if greeting[0] != 0xFF or not greeting[9] & 0x01:
        raise ProtocolViolation("not a ZMTP 3 peer")
    if greeting[10] < 3:
        raise ProtocolViolation(f"ZMTP version {greeting[10]}.{greeting[11]} is not supported")
    if greeting[12:32].rstrip(b"\x00") != b"NULL":
        raise ProtocolViolation("only the NULL security mechanism is supported")


def frame_header(flags: int, size: int) -> bytes:
    if size < 256:
        return bytes((flags, size))
    return bytes((flags | LONG,)) + _LONG_SIZE.pack(size)


# frame headers of short frames, by flags (0 or MORE) then size
_SHORT_HEADS = (tuple(bytes((0, n)) for n in range(256)), tuple(bytes((MORE, n)) for n in range(256)))
_LONG_FLAGS = (bytes((LONG,)), bytes((MORE | LONG,)))


def encode(frames: Sequence[Any]) -> tuple[bytes, list[Any]]:
    """(small, pieces): small messages as one bytes object (pieces empty); otherwise `pieces` to write
    in order, large frames as they are (no copy)."""
    last = len(frames) - 1
    parts: list[Any] = []
    small = True
    more = 1
    for i, frame in enumerate(frames):
        size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
        if i == last:
            more = 0
        parts.append(_SHORT_HEADS[more][size] if size < 256 else _LONG_FLAGS[more] + _LONG_SIZE.pack(size))
        if size >= _JOIN_MAX:
            small = False
            parts.append(frame if type(frame) is bytes else memoryview(frame).cast("B"))
        else:
            parts.append(frame)
    if small:
        return b"".join(parts), []
    return b"", parts


class Messages:
    """A Reader's frames in (`on_frame`), ZMTP commands and whole multipart messages out."""

    def __init__(self, on_command: Callable[[memoryview], None],
                 on_message: Callable[[list[memoryview]], None]) -> None:
        self._on_command = on_command
        self._on_message = on_message
        self._parts: list[memoryview] = []
        self.handshaken = False  # set by the owner once the peer's READY is accepted: no data frame before it

    def idle(self) -> bool:
        """No message begun (its first frames received, its last not yet)."""
        return not self._parts

    def on_frame(self, flags: int, body: memoryview) -> None:
        if flags & COMMAND:
            self._on_command(body)
            return
        if not self.handshaken:  # (a frame held until READY would join the first message after it)
            raise ProtocolViolation("message before the handshake")
        self._parts.append(body)
        if not flags & MORE:
            parts, self._parts = self._parts, []
            self._on_message(parts)


class Reader:
    """Bytes in, `on_frame(flags, body)` out, starting after the 64-byte greeting (passed to
    `on_greeting`). Bodies are memoryviews that stay valid (never reused buffers)."""

    def __init__(self, on_greeting: Callable[[bytes], None], on_frame: Callable[[int, memoryview], None],
                 max_frame: int) -> None:
        self._on_greeting = on_greeting
        self._on_frame = on_frame
        self._max_frame = max_frame
        self._greeted = False
        self._tail = b""  # a header or small frame cut by the end of the last read
        self._big: bytearray | None = None  # a large frame being filled across reads (what has come of it)
        self._big_flags = 0
        self._big_size = 0  # its declared size

    def idle(self) -> bool:
        """Greeted, and nothing held over from the last read (a cut header or frame)."""
        return self._greeted and not self._tail and self._big is None

    def feed(self, data: Any) -> None:
        """`data`: bytes, or a writable buffer whose frames the receiver may change in place (a
        frame joined from two reads is then writable as well)."""
        view = memoryview(data)
        if self._big is not None:
            view = self._fill_big(view)
            if not view:
                return
        if self._tail:
            joined = bytearray(self._tail)
            joined += view
            self._tail = b""
            view = memoryview(joined)
        if not self._greeted:
            if len(view) < GREETING_SIZE:
                self._tail = bytes(view)
                return
            self._greeted = True
            self._on_greeting(bytes(view[:GREETING_SIZE]))
            view = view[GREETING_SIZE:]
        self._frames(view)

    def _frames(self, view: memoryview) -> None:
        pos, end = 0, len(view)
        on_frame = self._on_frame
        while end - pos >= 2:
            flags = view[pos]
            if flags & LONG:
                if end - pos < 9:
                    break
                size = _LONG_SIZE.unpack_from(view, pos + 1)[0]
                start = pos + 9
            else:
                size = view[pos + 1]
                start = pos + 2
            if size > self._max_frame:
                raise ProtocolViolation(f"frame of {size} bytes exceeds the {self._max_frame}-byte limit")
            stop = start + size
            if stop > end:
                if size >= _SPLIT_COPY_MAX:  # fill a buffer of its own rather than re-joining reads
                    # it grows with what arrives: a header alone does not make this end allocate its size
                    self._big = bytearray(view[start:end])
                    self._big_flags = flags
                    self._big_size = size
                    return
                break
            on_frame(flags, view[start:stop])
            pos = stop
        if pos < end:
            self._tail = bytes(view[pos:end])

    def _fill_big(self, view: memoryview) -> memoryview:
        big = self._big
        assert big is not None
        n = min(len(view), self._big_size - len(big))
        big += view[:n]
        if len(big) == self._big_size:
            self._big = None
            self._on_frame(self._big_flags, memoryview(big))
        return view[n:]
