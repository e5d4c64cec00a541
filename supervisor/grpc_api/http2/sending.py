"""The sending half of an HTTP/2 server connection (a mixin of H2Connection): responses split into the
frames the client's settings and flow-control windows allow, DATA that waits for window, stream and
connection ends. Every write goes through `_write` / `_writelines`: while the transport is paused
(its buffer above the high-water mark: the client is not reading) the frames written are counted, and
a client owed too many is cut off (abuse.FloodGuard.queued) instead of buffered without bound.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Sequence
from typing import Any

from . import frames as f
from .abuse import NEVER, FloodGuard
from .streams import Stream

log = logging.getLogger("inferd.grpc")

# Response bytes waiting for the client's flow-control windows, all streams together: a unary answer
# that would go beyond this is refused (its call fails with RESOURCE_EXHAUSTED), so a client that never
# opens its window holds at most this much of ours (or one answer, if larger).
MAX_PENDING_OUT = 256 * 1024 * 1024
LINGER_S = 2.0  # after a connection error's GOAWAY, what the client still sends is read and dropped this long


# A whole answer at most this large leaves as one joined buffer (one copy of small pieces is cheaper than
# handing the transport many); a larger one leaves as its pieces, so big outputs are not copied here.
JOIN_LIMIT = 16 * 1024
_packers: dict[tuple[int, int], Any] = {}


def response_frames(stream_id: int, head: bytes, message: Sequence[Any], size: int, trailers: bytes) -> list[Any]:
    """HEADERS (`head`, END_HEADERS), DATA (`message`, `size` bytes) and HEADERS (`trailers`, END_STREAM) of
    one stream, as the buffers to write: byte for byte the frames `frames.header` builds, with the three
    frame headers and both header blocks packed at once (one struct per pair of block sizes)."""
    packer = _packers.get((len(head), len(trailers)))
    if packer is None:
        packer = struct.Struct(f">HBBBI{len(head)}sHBBBI")
        tail = struct.Struct(f">HBBBI{len(trailers)}s")
        if len(_packers) >= 64:  # head and trailers come from a few constants: this never fills in practice
            _packers.clear()
        packer = _packers[(len(head), len(trailers))] = (packer, tail)
    pre, post = packer
    hl, tl = len(head), len(trailers)
    first = pre.pack(hl >> 8, hl & 0xFF, f.HEADERS, f.END_HEADERS, stream_id, head,
                     size >> 8, size & 0xFF, f.DATA, 0, stream_id)
    last = post.pack(tl >> 8, tl & 0xFF, f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, trailers)
    if size <= JOIN_LIMIT:
        return [b"".join([first, *message, last])]
    return [first, *message, last]


class Sending:
    # set by H2Connection
    transport: asyncio.Transport | None
    streams: dict[int, Stream]
    conn_blocked: dict[int, Stream]  # streams with DATA waiting for the connection window only
    guard: FloodGuard
    cut: bool
    closing: bool
    last_stream_id: int
    send_window: int
    peer_max_frame: int
    pending_out: int
    _paused: bool

    # ---- writes ----
    def _write(self, data: bytes, ack: bool = False) -> None:
        if self.cut or (self._paused and not self._may_queue(ack)):
            return
        self.transport.write(data)  # type: ignore[union-attr]

    def _writelines(self, parts: list[Any]) -> None:
        if self.cut or (self._paused and not self._may_queue(False)):
            return
        self.transport.writelines(parts)  # type: ignore[union-attr]

    def _may_queue(self, ack: bool) -> bool:
        if self.guard.queued(ack):
            return True
        log.warning("cutting off a gRPC client that sends but does not read (%d frames, %d of them ACKs, unsent)",
                    self.guard.unsent_frames, self.guard.unsent_acks)
        self.cut = True
        if self.transport is not None:
            self.transport.abort()
        return False

    # ---- responses ----
    def respond(self, stream_id: int, head: bytes, message: Sequence[Any], size: int, trailers: bytes) -> bool:
        """HEADERS, one DATA payload made of `message` pieces (`size` bytes), trailers: in one write
        when the windows allow, else what they allow now and the rest as WINDOW_UPDATEs arrive.
        False (nothing sent) when the answer would have to wait and, with the bytes already waiting
        for the client's windows, the connection would hold more than MAX_PENDING_OUT (one answer
        may always wait, however large)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return True
        if size <= self.peer_max_frame and size <= self.send_window and size <= stream.send_window:
            self.send_window -= size
            stream.send_window -= size
            guard = self.guard
            guard.data_frames_sent += 1
            pings = guard.pings
            if pings.last is not NEVER:  # a PING came since we last sent (else there is nothing to forgive)
                pings.forgive()
            out = response_frames(stream_id, head, message, size, trailers)
            if len(out) != 1:
                self._writelines(out)
            elif self.cut or self._paused:
                self._write(out[0])
            else:  # _write's path when nothing holds the write back (one call less per answer)
                self.transport.write(out[0])  # type: ignore[union-attr]
            self._end(stream)
            return True
        if self.pending_out and self.pending_out + size > MAX_PENDING_OUT:
            return False
        self.send_headers(stream_id, head)
        self.send_data(stream_id, message)
        self.send_trailers(stream_id, trailers)
        return True

    def _header_frames(self, stream_id: int, block: bytes, end_stream: bool) -> list[bytes]:
        """HEADERS, then CONTINUATION frames if the block is larger than the peer's max frame size
        (a long grpc-message can be)."""
        flags = f.END_STREAM if end_stream else 0
        limit = self.peer_max_frame
        if len(block) <= limit:
            return [f.header(len(block), f.HEADERS, flags | f.END_HEADERS, stream_id), block]
        out = [f.header(limit, f.HEADERS, flags, stream_id), block[:limit]]
        for pos in range(limit, len(block), limit):
            piece = block[pos : pos + limit]
            last = f.END_HEADERS if pos + limit >= len(block) else 0
            out += [f.header(len(piece), f.CONTINUATION, last, stream_id), piece]
        return out

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        self.guard.pings.forgive()
        self._writelines(self._header_frames(stream_id, block, end_stream))
        if end_stream:
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._end(stream)

    def send_data(self, stream_id: int, pieces: Sequence[Any]) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        for piece in pieces:
            if len(piece):
                view = memoryview(piece).cast("B")
                stream.pending.append(view)
                self.pending_out += len(view)
        self._flush(stream)

    def send_trailers(self, stream_id: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.trailers = block
        self._flush(stream)

    @property
    def writable(self) -> bool:
        return not self._paused

    async def sent(self, stream_id: int) -> None:
        """Wait while the stream's DATA waits for the peer's flow-control windows (a streaming
        handler writes its next answer only then: what a slow reader is owed stays bounded)."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.pending:
            return
        if stream.sent is None or stream.sent.done():
            stream.sent = asyncio.get_running_loop().create_future()
        await stream.sent

    def _flush(self, stream: Stream) -> None:
        out: list[Any] = []
        pending = stream.pending
        while pending and self.send_window > 0 and stream.send_window > 0:
            chunk = pending[0]
            n = min(len(chunk), self.peer_max_frame, self.send_window, stream.send_window)
            out.append(f.header(n, f.DATA, 0, stream.id))
            if n == len(chunk):
                out.append(chunk)
                pending.pop(0)
            else:
                out.append(chunk[:n])
                pending[0] = chunk[n:]
            self.send_window -= n
            stream.send_window -= n
            self.pending_out -= n
            self.guard.data_frames_sent += 1
        if not pending:
            stream.wake()
            self.conn_blocked.pop(stream.id, None)
        elif stream.send_window > 0:  # only the connection window holds it back
            self.conn_blocked[stream.id] = stream
        done = not pending and stream.trailers is not None
        if done:
            out += self._header_frames(stream.id, stream.trailers or b"", True)
        if out:
            self.guard.pings.forgive()
            self._writelines(out)
        if done:
            self._end(stream)

    def _flush_blocked(self) -> None:
        """The connection window grew: streams waiting only for it go on, oldest first."""
        for stream in list(self.conn_blocked.values()):
            if self.send_window <= 0:
                return
            del self.conn_blocked[stream.id]
            if stream.id in self.streams:
                self._flush(stream)

    def _forget(self, stream: Stream) -> None:
        """The stream is gone: its waiting DATA is dropped and anyone waiting on it woken."""
        self.conn_blocked.pop(stream.id, None)
        if stream.pending:
            self.pending_out -= sum(len(p) for p in stream.pending)
            stream.pending.clear()
        stream.wake()

    def _end(self, stream: Stream) -> None:
        """We sent END_STREAM. A client still sending is told to stop (RST_STREAM NO_ERROR)."""
        self.streams.pop(stream.id, None)
        stream.handler = None
        if stream.pending or stream.sent is not None or stream.id in self.conn_blocked:
            self._forget(stream)
        if not stream.remote_closed:
            self._write(f.rst_stream(stream.id, f.NO_ERROR))
        if self.closing:
            self._close_if_idle()

    def _reset_stream(self, stream: Stream, code: int) -> None:
        self.streams.pop(stream.id, None)
        self._forget(stream)
        handler, stream.handler = stream.handler, None
        self._write(f.rst_stream(stream.id, code))
        if handler is not None:
            handler.on_reset()
        self._close_if_idle()

    # ---- connection end ----
    def goaway(self) -> None:
        """Graceful shutdown: no new streams; the open ones finish; then the connection closes."""
        if self.closing or self.transport is None or self.transport.is_closing():
            self.closing = True
            return
        self.closing = True
        self._write(f.goaway(self.last_stream_id, f.NO_ERROR))
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.closing and not self.streams and self.transport is not None:
            self.transport.close()

    def _fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY naming it, then close (at once when the client is not reading:
        the GOAWAY would only wait behind what it has not read)."""
        log.info("closing gRPC connection: %s", message)
        transport = self.transport
        if transport is None or transport.is_closing() or self.cut:
            # closing already (a TLS transport still delivers reads while it shuts down): nothing more the
            # client sends is read, the decoding context may be broken
            self.cut = True
            return
        self.closing = True
        self.cut = True  # from now on what the client sends is read and dropped
        if self._paused:
            transport.abort()
            return
        # GOAWAY, then half-close and linger: closing with the client's bytes unread would send a TCP
        # reset, and the client could lose the GOAWAY that says why
        transport.write(f.goaway(self.last_stream_id, code, message.encode()[:256]))
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER_S, transport.abort)
        else:
            transport.close()

    def abort(self) -> None:
        """Close now (shutdown after the grace period): running streams see a reset."""
        if self.transport is not None:
            self.transport.abort()
