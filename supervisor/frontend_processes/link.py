"""One framed, ordered, duplex link over a Unix stream socket (frames.py), for both of its ends.

`Link` is an asyncio Protocol: it cuts the byte stream into frames and calls `on_frame(kind, call,
header, data)` for each, in order, on the event loop. Bounded: a frame larger than `max_frame` closes
the link (a broken or hostile peer), and on the core's end writes beyond the transport's high-water mark
pause reading until the frontend has drained them, so the core does not buffer without limit.
`on_lost(exc)` is called once when the link is gone, whatever the reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from . import frames

log = logging.getLogger("inferd.scaleout")

_HEAD_REST = frames.HEAD.size - frames.PREFIX
OnFrame = Callable[[int, int, memoryview, memoryview], None]


class Link(asyncio.Protocol):
    def __init__(self, on_frame: OnFrame, on_lost: Callable[[Exception | None], None], max_frame: int,
                 throttle_reads: bool = False) -> None:
        """`throttle_reads`: stop reading while the peer is not reading what we write (the core's end: a
        frontend that does not take its answers gets no more work taken from it). Only one end may do so,
        or two ends each waiting for the other to read would stall for good; the frontend's end always reads."""
        self.throttle_reads = throttle_reads
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._need = 0  # bytes the frame in progress still lacks (0: reading a length)
        self._paused_writing = False
        self._out: list[Any] = []  # frames of this loop pass, written at its end
        self._flush_soon = False
        self._drained: asyncio.Future[None] | None = None
        self._call_soon: Callable[..., Any] | None = None  # the loop's (asyncio.get_running_loop costs a getpid)

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self._call_soon = asyncio.get_running_loop().call_soon
        transport.set_write_buffer_limits(high=64 * 1024 * 1024)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self._buf:
            self._buf += data
            data = bytes(self._buf)  # one copy; frames keep views of it
            self._buf.clear()
        view = memoryview(data)  # frames are views of `data` (immutable): no copy per frame
        pos = 0
        end = len(data)
        head = frames.HEAD
        while end - pos >= head.size:
            length, kind, call, hlen = head.unpack_from(data, pos)
            if length > self.max_frame or hlen > frames.MAX_HEADER_BYTES or hlen > length:
                log.error("frontend link: a frame of %d bytes (limit %d): closing the link", length, self.max_frame)
                self.close()
                return
            total = frames.PREFIX + length
            if end - pos < total:
                break
            start = pos + head.size
            pos += total
            self.on_frame(kind, call, view[start:start + hlen], view[start + hlen:pos])
            if self.closed:
                return
        if pos < end:
            self._buf += view[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed and self.transport is None:
            return
        self.closed = True
        self.transport = None
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self.on_lost(exc)

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self.throttle_reads and self.transport is not None:
            self.transport.pause_reading()  # the peer is not reading: stop taking more work from it

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self.throttle_reads and self.transport is not None:
            self.transport.resume_reading()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    @property
    def blocked(self) -> bool:
        """The peer is not reading what we write (and with `throttle_reads` we are not reading it either)."""
        return self._paused_writing

    # ---- sending ----
    def send(self, kind: int, call: int, header: bytes, chunks: list[Any] | None = None, size: int = 0) -> bool:
        """Queue one frame; False when the link is closed (the frame is dropped). The frames of one
        event-loop pass leave together at its end: one write for a batch's answers, not one each (a
        send that wakes the peer costs tens of µs on a VM). The chunks are referenced, not copied, until then."""
        if self.transport is None or self.closed:
            return False
        out = self._out
        out.append(frames.HEAD.pack(_HEAD_REST + len(header) + size, kind, call, len(header)) + header)
        if chunks:
            out.extend(chunks)
        if not self._flush_soon:
            self._flush_soon = True
            (self._call_soon or asyncio.get_running_loop().call_soon)(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_soon = False
        out, self._out = self._out, []
        transport = self.transport
        if transport is not None and out:
            transport.writelines(out)

    async def drain(self) -> None:
        if self._paused_writing and not self.closed:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self._flush()
            self.transport.close()
