"""Conversations of the `h2` library as a gRPC client with inferd's HTTP/2 server (fuzz/targets/_h2server.py):
differential on both ends of the wire.

The fuzz bytes choose what the client does, one step per turn of the conversation: open streams to
ModelInfer, ModelStreamInfer, ServerLive, an unknown method or with GET, with metadata (now and then large
enough for CONTINUATION frames), messages from the grpc_infer_request corpus or random bytes, gzip or
deflate compressed; more messages on open streams; resets; PINGs; new SETTINGS (small initial windows,
other frame sizes); connection window updates; PRIORITY. DATA goes out as h2's flow control allows, padded
now and then; a "stingy" client never gives back the response bytes it reads.

Checked:
- h2 reads everything the server writes without a protocol error (frames, HPACK, flow control, stream
  states: h2 raises on a violation), and the server logs no error, leaks no exception or task, and keeps
  its state within its caps (as in http2_frames);
- every stream the server opened carries exactly the headers h2 encoded (HPACK with h2's dynamic table and
  Huffman, CONTINUATION);
- every stream that ended normally was answered exactly as the server's methods answer its messages when
  called directly (same status, same response bytes): nothing lost, reordered or corrupted by framing,
  padding, flow control or message reassembly.
"""

from __future__ import annotations

import gzip
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from _fdp import provider
from _h2server import METHODS, SERVICE, loop, serve
from inferd.supervisor.grpc_api import native_server
from inferd.supervisor.grpc_api.http2.grpc_calls import Context
from inferd.supervisor.grpc_api.http2.grpc_wire import Abort

MAX_LEN = 4096
MAX_ROUNDS = 64
READ_SIZES = (1, 7, 9, 10, 64, 1000, 1 << 20)
PATHS = [SERVICE + "ModelInfer", SERVICE + "ModelStreamInfer", SERVICE + "ServerLive", SERVICE + "Nope", "/x"]
MESSAGES: list[bytes] = []
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "grpc_infer_request"


def setup() -> None:
    MESSAGES.extend(p.read_bytes() for p in sorted(CORPUS.iterdir()) if p.is_file())
    MESSAGES.append(b"")


# ---- what the server's methods answer, called directly ----


def _status(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, Abort):
        return exc.code, exc.message
    mapped = native_server._errors(exc)
    assert mapped is not None, f"a method raised {exc!r}"
    return mapped


def _framed(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


async def expected(path: str, messages: list[bytes]) -> tuple[int, bytes]:
    """(grpc-status, response bytes on the wire) for a stream that sent `messages` and ended."""
    method = METHODS[path]
    if not method.streaming:
        if not messages:
            return 12, b""  # UNIMPLEMENTED "Missing request message"
        request = method.decode(messages[0])
        try:
            if method.start is not None:
                future, state = method.start(request, Context(()))
                pieces, _size = method.finish(await future, state)  # type: ignore[misc]
                return 0, _framed(b"".join(bytes(p) for p in pieces))
            result = await method.handler(request, Context(()))
            return 0, _framed(method.encode(result) if method.encode else result)
        except Exception as exc:
            return _status(exc)[0], b""
    out = b""
    async for answer in method.handler(_aiter([method.decode(m) for m in messages]), Context(())):
        out += _framed(answer)
    return 0, out


async def _aiter(items: list[Any]) -> Any:
    for item in items:
        yield item


# ---- the client ----


class Client:
    def __init__(self, data: bytes) -> None:
        self.fdp = provider(data)
        self.rng = random.Random(zlib.crc32(data))
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.huffman = True  # off for a block with a large value: hpack's pure-Python Huffman coder is slow
        encode = self.h2.encoder.encode
        self.h2.encoder.encode = lambda headers, huffman=True: encode(headers, huffman=self.huffman)  # type: ignore
        self.stingy = self.fdp.ConsumeIntInRange(0, 7) == 0
        self.steps = self.fdp.ConsumeIntInRange(1, 10)
        self.rounds = 0
        self.goaway = False
        self.paths: dict[int, str] = {}
        self.headers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.messages: dict[int, list[bytes]] = {}
        self.compress: dict[int, str] = {}
        self.pending: dict[int, bytearray] = {}
        self.closing: set[int] = set()  # END_STREAM once pending is out
        self.reset: set[int] = set()  # by either side
        self.answers: dict[int, dict[str, Any]] = {}

    def first_reads(self) -> list[bytes]:
        return self.cut(self.h2.data_to_send() + self.act())

    def act(self) -> bytes:
        """Steps until one has something to send (or none are left), then what may be sent."""
        out = b""
        while not out and self.rounds < MAX_ROUNDS and not self.goaway:
            if self.steps <= 0:
                self.flush()
                return self.h2.data_to_send()
            self.steps -= 1
            self.step()
            self.flush()
            out = self.h2.data_to_send()
        return out

    def cut(self, data: bytes) -> list[bytes]:
        out, pos = [], 0
        while pos < len(data):
            n = self.rng.choice(READ_SIZES)
            out.append(data[pos : pos + n])
            pos += n
        return out

    # a conversation turn: read what the server wrote, take one step, send what may be sent
    def __call__(self, server_bytes: bytes) -> list[bytes]:
        self.rounds += 1
        for event in self.h2.receive_data(server_bytes):  # raises on a protocol violation by the server
            self.on_event(event)
        return self.cut(self.h2.data_to_send() + self.act())

    def on_event(self, ev: Any) -> None:
        sid = getattr(ev, "stream_id", 0)
        answer = self.answers.setdefault(sid, {"headers": None, "data": bytearray(), "trailers": None, "end": False})
        if isinstance(ev, h2.events.ResponseReceived):
            answer["headers"] = dict(ev.headers)
        elif isinstance(ev, h2.events.DataReceived):
            answer["data"] += ev.data
            if not self.stingy and ev.flow_controlled_length:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        elif isinstance(ev, h2.events.TrailersReceived):
            answer["trailers"] = dict(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded):
            answer["end"] = True
        elif isinstance(ev, h2.events.StreamReset):
            self.reset.add(sid)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = True

    def step(self) -> None:
        fdp = self.fdp
        kind = fdp.ConsumeIntInRange(0, 9)
        try:
            if kind <= 3:
                self.open_stream()
            elif kind == 4 and self.pending:
                sid = fdp.PickValueInList(sorted(self.pending))
                self.add_messages(sid)
            elif kind == 5 and self.paths:
                sid = fdp.PickValueInList(sorted(self.paths))
                self.h2.reset_stream(sid, fdp.PickValueInList([0, 1, 8]))
                self.reset.add(sid)
                self.pending.pop(sid, None)
            elif kind == 6:
                self.h2.ping(fdp.ConsumeBytes(8).ljust(8, b"\0"))
            elif kind == 7:
                s = h2.settings.SettingCodes
                self.h2.update_settings({
                    s.INITIAL_WINDOW_SIZE: fdp.PickValueInList([0, 1, 100, 5000, 65535, 1 << 20]),
                    s.MAX_FRAME_SIZE: fdp.PickValueInList([16384, 16385, 1 << 20]),
                })
            elif kind == 8:
                self.h2.increment_flow_control_window(fdp.ConsumeIntInRange(1, 1 << 20))
            elif kind == 9 and self.paths:
                self.h2.prioritize(fdp.PickValueInList(sorted(self.paths)), weight=fdp.ConsumeIntInRange(1, 256))
        except (h2.exceptions.ProtocolError, h2.exceptions.FlowControlError, h2.exceptions.StreamClosedError):
            pass  # h2 refuses a step its state does not allow (a closed stream, too many streams): not ours

    def open_stream(self) -> None:
        fdp = self.fdp
        sid = self.h2.get_next_available_stream_id()
        path = fdp.PickValueInList(PATHS)
        verb = b"GET" if fdp.ConsumeIntInRange(0, 15) == 0 else b"POST"
        headers = [(b":method", verb), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"fuzz"),
                   (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        encoding = fdp.PickValueInList(["", "", "", "gzip", "deflate"])
        if encoding:
            headers.append((b"grpc-encoding", encoding.encode()))
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            name = bytes(b"abcxyz-0123"[b % 11] for b in fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 8)))
            value = bytes(0x20 + b % 95 for b in fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 20)))
            if fdp.ConsumeIntInRange(0, 63) == 0:
                value = (value or b"v") * (17000 // max(len(value), 1))  # past 16 KiB: CONTINUATION frames
                self.huffman = False
            headers.append((b"x-" + name, value.strip()))
        body = fdp.ConsumeIntInRange(0, 3) != 0
        try:
            self.h2.send_headers(sid, headers, end_stream=not body)
        finally:
            self.huffman = True
        self.paths[sid] = path if verb == b"POST" else "GET"
        self.headers[sid] = headers
        self.messages[sid] = []
        self.compress[sid] = encoding
        if body:
            self.pending[sid] = bytearray()
            self.add_messages(sid)

    def add_messages(self, sid: int) -> None:
        fdp = self.fdp
        for _ in range(fdp.ConsumeIntInRange(0, 2) if self.paths[sid].endswith("StreamInfer") else 1):
            if fdp.ConsumeBool() and MESSAGES:
                message = fdp.PickValueInList(MESSAGES)
            else:
                message = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
            self.messages[sid].append(message)
            encoding = self.compress[sid]
            if encoding and fdp.ConsumeBool():
                packed = gzip.compress(message) if encoding == "gzip" else zlib.compress(message)
                self.pending[sid] += struct.pack(">BI", 1, len(packed)) + packed
            else:
                self.pending[sid] += _framed(message)
        if not self.paths[sid].endswith("StreamInfer") or fdp.ConsumeBool():
            self.closing.add(sid)

    def flush(self) -> None:
        for sid in list(self.pending):
            buf = self.pending[sid]
            while True:
                room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
                end = sid in self.closing
                if not buf and not end:
                    break
                pad = self.rng.choice([0, 0, 0, 1, 9]) if room > 10 else 0
                n = min(len(buf), room - (pad + 1 if pad else 0))
                if n <= 0 and buf:
                    break
                last = n == len(buf)
                self.h2.send_data(sid, bytes(buf[:n]), end_stream=end and last, pad_length=pad or None)
                del buf[:n]
                if last:
                    break
            if not buf and sid in self.closing:
                del self.pending[sid]


def _text(pairs: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in pairs]


def test_one_input(data: bytes) -> None:
    client = Client(data)
    outcome = serve(client.first_reads(), client)
    assert not outcome.failures, "\n".join(outcome.failures)
    for sid, headers in outcome.opened.items():
        assert sid in client.headers, f"the server opened stream {sid}, which the client never opened"
        assert headers == _text(client.headers[sid]), f"stream {sid}: {headers!r}, sent {client.headers[sid]!r}"
    for sid, path in client.paths.items():
        answer = client.answers.get(sid)
        if sid in client.reset or answer is None or not answer["end"] or sid in client.pending:
            continue  # reset, or not over yet (a stingy client, a step h2 refused, the rounds ran out)
        head = answer["headers"] or {}
        if path == "GET":
            assert head.get(b":status") == b"405", f"stream {sid}: GET answered {head!r}"
            continue
        assert head.get(b":status") == b"200", f"stream {sid}: {head!r}"
        if path not in METHODS:
            assert head.get(b"grpc-status") == b"12", f"stream {sid}: unknown method answered {head!r}"
            continue
        trailers = answer["trailers"] or head  # a Trailers-Only answer has its status in the headers
        status, body = loop().run_until_complete(expected(path, client.messages[sid]))
        got = int(trailers.get(b"grpc-status", b"-1"))
        assert got == status, f"stream {sid} ({path}): status {got} {trailers!r}, expected {status}"
        if status == 0:
            assert bytes(answer["data"]) == body, f"stream {sid} ({path}): other response bytes"
