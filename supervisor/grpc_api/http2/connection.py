"""One HTTP/2 server connection (RFC 9113) as an asyncio protocol: frames, streams, flow control.

What gRPC needs and nothing more: no server push, no priorities (PRIORITY is read and ignored); TLS,
when configured, is the transport's, below this protocol. Requests are handed to `app.open_stream`
once their headers are complete; the stream handler it returns gets the DATA payloads (memoryviews
into the received chunk: no copy here) and a reset.
Responses go out through `respond` / `send_headers` / `send_data` / `send_trailers`, which split
DATA into frames the peer accepts and queue what its flow-control windows do not yet allow.

A `Lifetime` (lifetime.py) adds the server's side of gRPC's connection management: keepalive PINGs
and a maximum connection age.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from . import frames as f
from .hpack_codec import Decoder, HeaderListTooLarge
from .lifetime import ConnectionLifetime, Lifetime
from .reader import FrameReader
from .streams import STREAM_WINDOW, App, Stream

log = logging.getLogger("inferd.grpc")

MAX_CONCURRENT_STREAMS = 4096
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME_IN = 1024 * 1024  # largest frame we accept (fewer frames for big tensors)
MAX_HEADER_LIST = 64 * 1024
MAX_HEADER_BLOCK = 2 * MAX_HEADER_LIST  # HEADERS + CONTINUATION bytes before decoding
# Request messages still arriving, all streams of a connection together: beyond this, new data for any
# stream but the oldest such one fails that request (each stream's window alone would allow 16 GiB).
MAX_PARTIAL_BYTES = 256 * 1024 * 1024


_SETTINGS = f.settings(
    {
        f.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
        f.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        f.MAX_FRAME_SIZE: MAX_FRAME_IN,
        f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    }
) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)


class H2Connection(asyncio.Protocol):
    def __init__(self, app: App, lifetime: Lifetime | None = None) -> None:
        self.app = app
        self.lifetime = ConnectionLifetime(self, lifetime) if lifetime is not None else None
        self.heard = False  # bytes arrived since the last keepalive check (the lifetime resets it)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.closing = False  # GOAWAY sent: no new streams
        self.decoder = Decoder(MAX_HEADER_LIST)
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.conn_unacked = 0
        self.partial: dict[int, int] = {}  # stream id -> bytes of its unfinished request message, oldest first
        self.partial_bytes = 0
        self.reader = FrameReader(self._frame, MAX_FRAME_IN)
        self._header_block: list[bytes] = []  # HEADERS + CONTINUATION being collected
        self._header_stream = 0
        self._header_end_stream = False
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(_SETTINGS)  # type: ignore[union-attr]
        if self.lifetime is not None:
            self.lifetime.start()
        self.app.connection_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lifetime is not None:
            self.lifetime.stop()
        streams, self.streams = self.streams, {}
        for s in streams.values():
            s.wake()
            if s.handler is not None:
                s.handler.on_reset()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self.app.connection_lost(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._paused:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def data_received(self, data: bytes) -> None:
        self.heard = True
        try:
            if not self.reader.feed(data):
                self.transport.close()  # type: ignore[union-attr]  # not HTTP/2 (an HTTP/1 client?)
        except f.ConnectionError_ as exc:
            self._fail(exc.code, str(exc))

    # ---- frames ----
    def _frame(self, ftype: int, flags: int, sid: int, payload: memoryview) -> None:
        if self._header_stream and ftype != f.CONTINUATION:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if ftype == f.DATA:
            self._on_data(flags, sid, payload)
        elif ftype == f.HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == f.CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif ftype == f.RST_STREAM:
            self._on_rst(sid, payload)
        elif ftype == f.SETTINGS:
            self._on_settings(flags, sid, payload)
        elif ftype == f.PING:
            if len(payload) != 8 or sid:
                raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "bad PING")
            if not flags & f.ACK:
                self.transport.write(f.ping_ack(bytes(payload)))  # type: ignore[union-attr]
            elif self.lifetime is not None:
                self.lifetime.on_ping_ack(bytes(payload))
        elif ftype == f.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == f.GOAWAY:
            self.closing = True
            self._close_if_idle()
        elif ftype == f.PUSH_PROMISE:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored

    @staticmethod
    def _unpad(flags: int, payload: memoryview) -> memoryview:
        if flags & f.PADDED:
            if not payload:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "padded frame without pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1 : len(payload) - pad]
        return payload

    def _on_data(self, flags: int, sid: int, payload: memoryview) -> None:
        if not sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.conn_unacked += size
        if self.conn_unacked >= CONNECTION_WINDOW // 4:
            self.transport.write(f.window_update(0, self.conn_unacked))  # type: ignore[union-attr]
            self.conn_unacked = 0
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self.last_stream_id:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we already reset or answered: drop what the client still sends
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset_stream(stream, f.FLOW_CONTROL_ERROR)
            return
        end = bool(flags & f.END_STREAM)
        if end:
            stream.remote_closed = True
        body = self._unpad(flags, payload)
        stream.consumed += size - len(body)  # padding is ours to give back at once
        if stream.handler is not None:
            stream.handler.on_data(body, end)

    def acknowledge(self, stream_id: int, nbytes: int) -> None:
        """The handler is done with `nbytes` of the stream's data: the client may send that much more
        (given back in updates of at least a quarter window, not one per message)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.consumed += nbytes
        if stream.consumed >= STREAM_WINDOW // 4:
            self.transport.write(f.window_update(stream_id, stream.consumed))  # type: ignore[union-attr]
            stream.recv_window += stream.consumed
            stream.consumed = 0

    def hold(self, stream_id: int, delta: int) -> bool:
        """The unfinished request message of `stream_id` grew (or shrank) by `delta` bytes. False when
        the connection holds more than MAX_PARTIAL_BYTES and this is not the oldest such stream: the
        caller fails that request (the oldest always goes on, so one big message still completes)."""
        held = self.partial.get(stream_id, 0) + delta
        if held > 0:
            self.partial[stream_id] = held
        else:
            self.partial.pop(stream_id, None)
        self.partial_bytes += delta
        return delta <= 0 or self.partial_bytes <= MAX_PARTIAL_BYTES or next(iter(self.partial)) == stream_id

    def _on_headers(self, flags: int, sid: int, payload: memoryview) -> None:
        if not sid or not sid & 1:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "HEADERS on a stream a client cannot open")
        body = self._unpad(flags, payload)
        if flags & f.PRIORITY_FLAG:
            body = body[5:]
        self._header_block = [bytes(body)]
        self._header_stream = sid
        self._header_end_stream = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:
            self._headers_complete()

    def _on_continuation(self, flags: int, sid: int, payload: memoryview) -> None:
        if not self._header_stream or sid != self._header_stream:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION out of sequence")
        self._header_block.append(bytes(payload))
        if sum(map(len, self._header_block)) > MAX_HEADER_BLOCK:
            raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            self._headers_complete()

    def _headers_complete(self) -> None:
        sid, end = self._header_stream, self._header_end_stream
        block = b"".join(self._header_block)
        self._header_block = []
        self._header_stream = 0
        try:
            headers = self.decoder.decode(block)  # always: the decoder's table must follow the client
        except HeaderListTooLarge:
            headers = None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only the end of its stream matters
            if end:
                stream.remote_closed = True
                if stream.handler is not None:
                    stream.handler.on_data(memoryview(b""), True)
            return
        if sid <= self.last_stream_id:
            # a stream we already answered or reset: the client's trailers may have crossed our
            # END_STREAM / RST_STREAM on the wire, and frames on a stream we reset are ignored (RFC 9113 §5.1)
            return
        self.last_stream_id = sid
        if self.closing or len(self.streams) >= MAX_CONCURRENT_STREAMS or headers is None:
            self.transport.write(f.rst_stream(sid, f.REFUSED_STREAM))  # type: ignore[union-attr]
            return
        stream = Stream(sid, self.peer_initial_window)
        stream.remote_closed = end
        self.streams[sid] = stream
        stream.handler = handler = self.app.open_stream(self, sid, headers, end)
        if handler is None:
            self.streams.pop(sid, None)
        elif end:  # no DATA will come: the handler learns of the end here (a body-less call)
            handler.on_data(memoryview(b""), True)

    def _on_rst(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "bad RST_STREAM")
        if not sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        stream = self.streams.pop(sid, None)
        if stream is not None:
            stream.wake()
            if stream.handler is not None:
                stream.handler.on_reset()
        self._close_if_idle()

    def _on_settings(self, flags: int, sid: int, payload: memoryview) -> None:
        if sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            return
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise f.ConnectionError_(f.PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
        self.transport.write(f.SETTINGS_ACK)  # type: ignore[union-attr]
        self._flush_blocked()

    def _on_window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise f.ConnectionError_(f.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        inc = f.u32(payload) & 0x7FFFFFFF
        if not sid:
            self.send_window += inc
            if not inc or self.send_window > f.MAX_WINDOW:
                raise f.ConnectionError_(f.FLOW_CONTROL_ERROR if inc else f.PROTOCOL_ERROR, "bad WINDOW_UPDATE")
            self._flush_blocked()
            return
        stream = self.streams.get(sid)
        if stream is not None:
            stream.send_window += inc
            if not inc or stream.send_window > f.MAX_WINDOW:  # a stream error (RFC 9113 §6.9)
                self._reset_stream(stream, f.FLOW_CONTROL_ERROR if inc else f.PROTOCOL_ERROR)
                return
            self._flush(stream)

    # ---- sending ----
    def respond(self, stream_id: int, head: bytes, message: Sequence[Any], size: int, trailers: bytes) -> None:
        """HEADERS, one DATA payload made of `message` pieces (`size` bytes), trailers: in one write
        when the windows allow, else what they allow now and the rest as WINDOW_UPDATEs arrive."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if size <= self.peer_max_frame and size <= self.send_window and size <= stream.send_window:
            self.send_window -= size
            stream.send_window -= size
            self.transport.writelines(  # type: ignore[union-attr]
                [
                    f.header(len(head), f.HEADERS, f.END_HEADERS, stream_id),
                    head,
                    f.header(size, f.DATA, 0, stream_id),
                    *message,
                    f.header(len(trailers), f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id),
                    trailers,
                ]
            )
            self._end(stream)
            return
        self.send_headers(stream_id, head)
        self.send_data(stream_id, message)
        self.send_trailers(stream_id, trailers)

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
        self.transport.writelines(self._header_frames(stream_id, block, end_stream))  # type: ignore[union-attr]
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
                stream.pending.append(memoryview(piece).cast("B"))
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
        if not pending:
            stream.wake()
        done = not pending and stream.trailers is not None
        if done:
            out += self._header_frames(stream.id, stream.trailers or b"", True)
        if out:
            self.transport.writelines(out)  # type: ignore[union-attr]
        if done:
            self._end(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self.streams.values()):
            if self.send_window <= 0:
                return
            if stream.pending or stream.trailers is not None:
                self._flush(stream)

    def _end(self, stream: Stream) -> None:
        """We sent END_STREAM. A client still sending is told to stop (RST_STREAM NO_ERROR)."""
        self.streams.pop(stream.id, None)
        stream.handler = None
        stream.wake()
        if not stream.remote_closed:
            self.transport.write(f.rst_stream(stream.id, f.NO_ERROR))  # type: ignore[union-attr]
        self._close_if_idle()

    def _reset_stream(self, stream: Stream, code: int) -> None:
        self.streams.pop(stream.id, None)
        stream.wake()
        handler, stream.handler = stream.handler, None
        self.transport.write(f.rst_stream(stream.id, code))  # type: ignore[union-attr]
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
        self.transport.write(f.goaway(self.last_stream_id, f.NO_ERROR))
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.closing and not self.streams and self.transport is not None:
            self.transport.close()

    def _fail(self, code: int, message: str) -> None:
        log.info("closing gRPC connection: %s", message)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(f.goaway(self.last_stream_id, code, message.encode()[:256]))
            self.transport.close()

    def abort(self) -> None:
        """Close now (shutdown after the grace period): running streams see a reset."""
        if self.transport is not None:
            self.transport.abort()
