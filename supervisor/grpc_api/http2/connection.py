"""One HTTP/2 server connection (RFC 9113) as an asyncio protocol: frames, streams, flow control.

What gRPC needs and nothing more: no server push, no priorities (PRIORITY is read and ignored); TLS,
when configured, is the transport's, below this protocol. Requests are handed to `app.open_stream`
once their headers are complete; the stream handler it returns gets the DATA payloads (memoryviews
into the received chunk: no copy here) and a reset.
Responses go out through `respond` / `send_headers` / `send_data` / `send_trailers` (sending.py),
which split DATA into frames the peer accepts and queue what its flow-control windows do not yet allow.

A `Lifetime` (lifetime.py) adds the server's side of gRPC's connection management: keepalive PINGs
and a maximum connection age. A `FloodGuard` (abuse.py) counts what the client makes us do for free
and ends abuse with GOAWAY(ENHANCE_YOUR_CALM); every write goes through `_write`, which cuts off a
client that sends while not reading our answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from . import frames as f
from . import hpack_codec
from .abuse import MAX_CONTINUATIONS, MAX_SETTINGS, STREAMS_PER_GLITCH, Flood, FloodGuard, PingPolicy
from .hpack_codec import Decoder, HeaderListTooLarge
from .lifetime import ConnectionLifetime, Lifetime
from .reader import FrameReader
from .sending import Sending
from .streams import STREAM_WINDOW, Stream, StreamHandler

log = logging.getLogger("inferd.grpc")

MAX_CONCURRENT_STREAMS = 4096
CONNECTION_WINDOW = 64 * 1024 * 1024
CONNECTION_UPDATE_AT = CONNECTION_WINDOW // 4  # received bytes given back to the connection window at once
MAX_FRAME_IN = 1024 * 1024  # largest frame we accept (fewer frames for big tensors)
MAX_HEADER_LIST = 64 * 1024
MAX_HEADER_BLOCK = 2 * MAX_HEADER_LIST  # HEADERS + CONTINUATION bytes before decoding
# Request messages still arriving, all streams of a connection together: beyond this, new data for any
# stream but the oldest such one fails that request (each stream's window alone would allow 16 GiB).
MAX_PARTIAL_BYTES = 256 * 1024 * 1024
# A client that has not sent the whole preface by then is dropped (grpc-core's server handshake timeout).
HANDSHAKE_TIMEOUT_S = 120.0


class _CutOff(Exception):
    """The connection was aborted while a read was being parsed: stop parsing it."""


_SETTINGS = f.settings(
    {
        f.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
        f.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        f.MAX_FRAME_SIZE: MAX_FRAME_IN,
        f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    }
) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)


# what the application implements: the connection calls these
class App(Protocol):
    def open_stream(
        self, conn: H2Connection, stream_id: int, headers: list[tuple[str, str]], end_stream: bool
    ) -> StreamHandler | None: ...
    def connection_made(self, conn: H2Connection) -> None: ...
    def connection_lost(self, conn: H2Connection) -> None: ...


class H2Connection(Sending, asyncio.Protocol):
    def __init__(self, app: App, lifetime: Lifetime | None = None, pings: PingPolicy | None = None) -> None:
        self.app = app
        self.guard = FloodGuard(pings or PingPolicy())
        self.cut = False  # failed, cut off or lost: nothing more is parsed or written
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
        self._header_block = bytearray()  # HEADERS + CONTINUATION being collected
        self._continuations = 0
        self._header_stream = 0
        self._header_end_stream = False
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._handshake: asyncio.TimerHandle | None = None  # drops a client that never sends the preface
        self.conn_blocked: dict[int, Stream] = {}  # streams with DATA waiting for the connection window
        self.pending_out = 0  # bytes of DATA waiting for windows, all streams

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(_SETTINGS)  # type: ignore[union-attr]
        self._handshake = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._handshake_expired)
        if self.lifetime is not None:
            self.lifetime.start()
        self.app.connection_made(self)

    def _handshake_expired(self) -> None:
        log.info("closing gRPC connection: no HTTP/2 preface within %g s", HANDSHAKE_TIMEOUT_S)
        self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
        if self.lifetime is not None:
            self.lifetime.stop()
        self.cut = True  # nothing more goes out
        streams, self.streams = self.streams, {}
        self.conn_blocked.clear()
        self.pending_out = 0
        for s in streams.values():
            s.pending.clear()
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
        self.guard.drained()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._paused:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def data_received(self, data: bytes) -> None:
        if self.cut:  # failed: lingering until the client closes (sending._fail)
            return
        self.heard = True
        try:
            if not self.reader.feed(data):
                self.transport.close()  # type: ignore[union-attr]  # not HTTP/2 (an HTTP/1 client?)
            elif self._handshake is not None and self.reader.preface_seen:
                self._handshake.cancel()
                self._handshake = None
        except f.ConnectionError_ as exc:
            self._fail(exc.code, str(exc))
        except Flood as exc:
            self._fail(f.ENHANCE_YOUR_CALM, str(exc))
        except _CutOff:
            pass

    # ---- frames ----
    def _frame(self, ftype: int, flags: int, sid: int, payload: memoryview) -> None:
        if self.cut:
            raise _CutOff
        if self._header_stream and ftype != f.CONTINUATION:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if ftype == f.DATA:  # handled here, not in a method of its own: one call less per request
            if not sid:
                raise f.ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
            size = len(payload)
            if not size and not flags & f.END_STREAM:
                self.guard.glitch("empty DATA frames")
            self.conn_unacked += size
            if self.conn_unacked >= CONNECTION_UPDATE_AT:
                self._write(f.window_update(0, self.conn_unacked))
                self.conn_unacked = 0
            stream = self.streams.get(sid)
            if stream is None or stream.remote_closed:
                if sid > self.last_stream_id:
                    raise f.ConnectionError_(f.PROTOCOL_ERROR, "DATA on an idle stream")
                return  # a stream we already reset or answered: drop what the client still sends
            stream.recv_window -= size
            if stream.recv_window < 0:
                self.guard.glitch("streams over their window")
                self._reset_stream(stream, f.FLOW_CONTROL_ERROR)
                return
            end = bool(flags & f.END_STREAM)
            if end:
                stream.remote_closed = True
            if flags & f.PADDED:
                payload = self._unpad(flags, payload)
                stream.consumed += size - len(payload)  # padding is ours to give back at once
            if stream.handler is not None:
                stream.handler.on_data(payload, end)
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
                self.guard.glitch("PINGs")
                if self.guard.pings.received(bool(self.streams)):
                    raise Flood("too_many_pings")
                self._write(f.ping_ack(bytes(payload)), ack=True)
            elif self.lifetime is not None:
                self.lifetime.on_ping_ack(bytes(payload))
        elif ftype == f.WINDOW_UPDATE:
            self.guard.window_update()
            self._on_window_update(sid, payload)
        elif ftype == f.GOAWAY:
            self.closing = True
            self._close_if_idle()
        elif ftype == f.PUSH_PROMISE:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:  # PRIORITY and unknown frame types are ignored, but not for free
            self.guard.glitch("PRIORITY or unknown frames")

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

    def acknowledge(self, stream_id: int, nbytes: int) -> None:
        """The handler is done with `nbytes` of the stream's data: the client may send that much more
        (given back in updates of at least a quarter window, not one per message)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.consumed += nbytes
        if stream.consumed >= STREAM_WINDOW // 4:
            self._write(f.window_update(stream_id, stream.consumed))
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
        body = self._unpad(flags, payload) if flags & f.PADDED else payload
        if flags & f.PRIORITY_FLAG:
            body = body[5:]
        if len(body) > MAX_HEADER_BLOCK:
            raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "header block too large")
        self._header_stream = sid
        self._header_end_stream = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:  # the common case: the whole block in one frame
            self._headers_complete(bytes(body))
            return
        self._header_block = bytearray(body)
        self._continuations = 0

    def _on_continuation(self, flags: int, sid: int, payload: memoryview) -> None:
        if not self._header_stream or sid != self._header_stream:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION out of sequence")
        # counted and capped as they come (joining them all at every frame was quadratic)
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise Flood(f"more than {MAX_CONTINUATIONS} CONTINUATION frames in one header block")
        if len(self._header_block) + len(payload) > MAX_HEADER_BLOCK:
            raise f.ConnectionError_(f.ENHANCE_YOUR_CALM, "header block too large")
        self._header_block += payload
        if flags & f.END_HEADERS:
            block = bytes(self._header_block)
            self._header_block = bytearray()
            self._headers_complete(block)

    def _headers_complete(self, block: bytes) -> None:
        sid, end = self._header_stream, self._header_end_stream
        self._header_stream = 0
        before = hpack_codec.huffman_decoded
        try:
            headers = self.decoder.decode(block)  # always: the decoder's table must follow the client
        except HeaderListTooLarge:
            headers = None
        finally:
            self.guard.huffman_decoded(hpack_codec.huffman_decoded - before)  # (Flood: the connection goes)
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
        self.guard.streams_opened += 1
        if self.closing or len(self.streams) >= MAX_CONCURRENT_STREAMS or headers is None:
            self.guard.glitch("refused streams")
            self._write(f.rst_stream(sid, f.REFUSED_STREAM))
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
        self.guard.reset()
        stream = self.streams.pop(sid, None)
        if stream is not None:
            self._forget(stream)
            if stream.handler is not None:
                stream.handler.on_reset()
        self._close_if_idle()

    def _on_settings(self, flags: int, sid: int, payload: memoryview) -> None:
        if sid:
            raise f.ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            return
        if len(payload) > 6 * MAX_SETTINGS:
            raise Flood(f"more than {MAX_SETTINGS} entries in a SETTINGS frame")
        self.guard.glitch("SETTINGS frames")
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                if delta and self.streams:  # every open stream is updated: costs in proportion
                    self.guard.glitch("SETTINGS frames", len(self.streams) / STREAMS_PER_GLITCH)
                    for s in self.streams.values():
                        s.send_window += delta
                        if delta > 0 and s.pending:
                            self.conn_blocked[s.id] = s
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise f.ConnectionError_(f.PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
        self._write(f.SETTINGS_ACK, ack=True)
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
                self.guard.glitch("bad WINDOW_UPDATEs")
                self._reset_stream(stream, f.FLOW_CONTROL_ERROR if inc else f.PROTOCOL_ERROR)
                return
            if stream.pending:
                self._flush(stream)
