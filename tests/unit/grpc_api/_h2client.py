"""A small blocking HTTP/2 client over a raw socket, for driving inferd's own gRPC server frame by frame.

It keeps the flow-control books both ways (and checks the server against them): what it may send
(the server's SETTINGS and WINDOW_UPDATEs) and what the server may send (our SETTINGS, our updates).
Frames are built with the server's own frames.py helpers, header blocks with the `hpack` package.
"""

from __future__ import annotations

import socket
import struct
from collections import deque
from dataclasses import dataclass, field

import hpack
from inferd.supervisor.grpc_api.http2 import frames as f

TIMEOUT = 60.0  # per socket read: generous, a busy 2-core box may take a while
SERVICE = "/inference.GRPCInferenceService/"


@dataclass
class Frame:
    type: int
    flags: int
    sid: int
    payload: bytes
    returned: bool = False  # DATA whose bytes went back to the connection window already


@dataclass
class Response:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    frames: list[Frame] = field(default_factory=list)
    reset: int | None = None  # RST_STREAM code, if the server reset the stream

    @property
    def status(self) -> int | None:
        """grpc-status (from the trailers, or a Trailers-Only answer's headers)."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    def messages(self) -> list[bytes]:
        out, pos = [], 0
        while pos < len(self.data):
            flag, length = struct.unpack_from(">BI", self.data, pos)
            assert flag == 0
            out.append(self.data[pos + 5 : pos + 5 + length])
            pos += 5 + length
        assert pos == len(self.data)
        return out


def grpc_message(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


def request_headers(path: str, authority: str = "test", **extra: str) -> list[tuple[str, str]]:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return fields + [(k.replace("_", "-"), v) for k, v in extra.items()]


class H2Client:
    def __init__(self, url: str, settings: dict[int, int] | None = None, connection_window: int = 0) -> None:
        host, port = url.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.backlog: deque[Frame] = deque()  # frames read while waiting for something else
        self.server_settings: dict[int, int] = {}
        self.settings_acked = 0
        # what we may send
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.stream_send: dict[int, int] = {}
        self.window_updates: list[tuple[int, int]] = []  # (stream, increment) from the server
        # what the server may send us
        self.settings = settings or {}
        self.my_initial = self.settings.get(f.INITIAL_WINDOW_SIZE, f.DEFAULT_WINDOW)
        self.my_max_frame = self.settings.get(f.MAX_FRAME_SIZE, f.DEFAULT_MAX_FRAME)
        self.recv_window = f.DEFAULT_WINDOW + connection_window
        self.stream_recv: dict[int, int] = {}
        self._connection_window = connection_window
        self.next_sid = 1

    # ---- sending ----
    def opening(self) -> bytes:
        out = f.PREFACE + f.settings(self.settings)
        if self._connection_window:
            out += f.window_update(0, self._connection_window)
        return out

    def start(self) -> H2Client:
        self.send(self.opening())
        return self

    def send(self, data: bytes, bytewise: bool = False) -> None:
        if bytewise:
            for i in range(len(data)):
                self.sock.sendall(data[i : i + 1])
        else:
            self.sock.sendall(data)

    def change_settings(self, values: dict[int, int]) -> None:
        """New SETTINGS of ours; returns once the server acknowledged them."""
        self.send(f.settings(values))
        self.wait_for(f.SETTINGS)
        if f.INITIAL_WINDOW_SIZE in values:
            for sid in self.stream_recv:
                self.stream_recv[sid] += values[f.INITIAL_WINDOW_SIZE] - self.my_initial
            self.my_initial = values[f.INITIAL_WINDOW_SIZE]
        self.my_max_frame = values.get(f.MAX_FRAME_SIZE, self.my_max_frame)

    def new_stream(self) -> int:
        sid = self.next_sid
        self.next_sid += 2
        self.stream_send[sid] = self.peer_initial
        self.stream_recv[sid] = self.my_initial
        return sid

    def headers(self, sid: int, fields: list[tuple[str, str]], end_stream: bool = False, pieces: int = 1) -> bytes:
        """HEADERS (+ CONTINUATION frames when `pieces` > 1) carrying `fields`."""
        block = self.encoder.encode(fields)
        step = -(-len(block) // pieces)
        chunks = [block[i : i + step] for i in range(0, len(block), step)] or [b""]
        out = []
        for i, chunk in enumerate(chunks):
            flags = f.END_HEADERS if i == len(chunks) - 1 else 0
            if i == 0:
                flags |= f.END_STREAM if end_stream else 0
            out.append(f.header(len(chunk), f.HEADERS if i == 0 else f.CONTINUATION, flags, sid) + chunk)
        return b"".join(out)

    def data_frame(self, sid: int, payload: bytes, end_stream: bool = False) -> bytes:
        """One DATA frame, charged to the windows (the caller checks they allow it)."""
        self.send_window -= len(payload)
        self.stream_send[sid] -= len(payload)
        assert self.send_window >= 0 and self.stream_send[sid] >= 0
        return f.header(len(payload), f.DATA, f.END_STREAM if end_stream else 0, sid) + payload

    def send_data(self, sid: int, payload: bytes, end_stream: bool = True) -> int:
        """Sends `payload` as the windows allow, reading WINDOW_UPDATEs when they are spent.
        Returns how many times it had to wait for the server's window."""
        waits = 0
        view = memoryview(payload)
        while True:
            n = min(len(view), self.send_window, self.stream_send[sid], self.peer_max_frame)
            if n > 0 or not view:
                last = n == len(view)
                self.send(self.data_frame(sid, bytes(view[:n]), end_stream and last))
                view = view[n:]
                if last:
                    return waits
                continue
            waits += 1
            self.backlog.append(self._read())  # handles WINDOW_UPDATE / SETTINGS on the way

    # ---- receiving ----
    def _read(self) -> Frame:
        while len(self.buf) < 9 or len(self.buf) < 9 + f.parse_header(bytes(self.buf[:9]), 0)[0]:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buf += chunk
        length, ftype, flags, sid = f.parse_header(bytes(self.buf[:9]), 0)
        frame = Frame(ftype, flags, sid, bytes(self.buf[9 : 9 + length]))
        del self.buf[: 9 + length]
        self._account(frame)
        return frame

    def _account(self, frame: Frame) -> None:
        if frame.type == f.SETTINGS and not frame.flags & f.ACK:
            for key, value in f.parse_settings(frame.payload):
                self.server_settings[key] = value
                if key == f.INITIAL_WINDOW_SIZE:
                    for sid in self.stream_send:
                        self.stream_send[sid] += value - self.peer_initial
                    self.peer_initial = value
                elif key == f.MAX_FRAME_SIZE:
                    self.peer_max_frame = value
            self.send(f.SETTINGS_ACK)
        elif frame.type == f.SETTINGS:
            self.settings_acked += 1
        elif frame.type == f.WINDOW_UPDATE:
            inc = f.u32(frame.payload)
            self.window_updates.append((frame.sid, inc))
            if frame.sid:
                if frame.sid in self.stream_send:
                    self.stream_send[frame.sid] += inc
            else:
                self.send_window += inc
        elif frame.type == f.DATA:
            assert len(frame.payload) <= self.my_max_frame, "DATA frame above our SETTINGS_MAX_FRAME_SIZE"
            self.recv_window -= len(frame.payload)
            self.stream_recv[frame.sid] -= len(frame.payload)
            assert self.recv_window >= 0, "the server overran the connection window"
            assert self.stream_recv[frame.sid] >= 0, "the server overran the stream window"
        elif frame.type in (f.HEADERS, f.CONTINUATION):
            assert len(frame.payload) <= self.my_max_frame, "header frame above our SETTINGS_MAX_FRAME_SIZE"

    def next_frame(self) -> Frame:
        return self.backlog.popleft() if self.backlog else self._read()

    def wait_for(self, ftype: int, sid: int | None = None) -> Frame:
        """The next frame of `ftype` (on `sid`); other frames are kept for later."""
        for i, frame in enumerate(self.backlog):
            if frame.type == ftype and (sid is None or frame.sid == sid):
                del self.backlog[i]
                return frame
        while True:
            frame = self._read()
            if frame.type == ftype and (sid is None or frame.sid == sid):
                return frame
            self.backlog.append(frame)

    def header_block(self, first: Frame) -> dict[str, str]:
        block = first.payload
        frame = first
        while not frame.flags & f.END_HEADERS:
            frame = self.wait_for(f.CONTINUATION, first.sid)
            block += frame.payload
        return {n: v for n, v in self.decoder.decode(block)}

    def response(self, sid: int, give_back: bool = True) -> Response:
        """Reads the stream's answer to its end; with `give_back`, every DATA frame's bytes are
        handed back at once with WINDOW_UPDATEs (stream and connection)."""
        resp = Response()
        pending = [fr for fr in self.backlog if fr.sid == sid]
        for fr in pending:
            self.backlog.remove(fr)
        data = bytearray()
        while True:
            frame = pending.pop(0) if pending else self._read()
            if frame.sid != sid:  # another stream's: its bytes go back to the connection at once
                if give_back and frame.type == f.DATA and frame.payload and not frame.returned:
                    self.send(f.window_update(0, len(frame.payload)))
                    self.recv_window += len(frame.payload)
                    frame.returned = True
                self.backlog.append(frame)
                continue
            resp.frames.append(frame)
            if frame.type == f.RST_STREAM:
                resp.reset = f.u32(frame.payload)
                break
            if frame.type == f.DATA:
                data += frame.payload
                if give_back and frame.payload:
                    n = len(frame.payload)
                    self.send(f.window_update(sid, n) + (b"" if frame.returned else f.window_update(0, n)))
                    self.recv_window += 0 if frame.returned else n
                    self.stream_recv[sid] += n
            elif frame.type == f.HEADERS:
                fields = self.header_block(frame)
                if not resp.headers:
                    resp.headers = fields
                else:
                    resp.trailers = fields
            if frame.type in (f.DATA, f.HEADERS) and frame.flags & f.END_STREAM:
                break
        resp.data = bytes(data)
        return resp

    def unary(self, path: str, message: bytes, **extra: str) -> Response:
        sid = self.new_stream()
        self.send(self.headers(sid, request_headers(SERVICE + path if "/" not in path else path, **extra)))
        self.send_data(sid, grpc_message(message))
        return self.response(sid)

    def read_until_closed(self) -> list[Frame]:
        """Frames up to the server closing the connection (a reset counts as closed)."""
        out = list(self.backlog)
        self.backlog.clear()
        try:
            while True:
                out.append(self._read())
        except (EOFError, ConnectionResetError):
            return out

    def close(self) -> None:
        self.sock.close()
