"""gRPC over HTTP/2 (the gRPC "PROTOCOL-HTTP2" spec): message framing, status trailers, deadlines,
and the two kinds of call this service has: unary and bidirectional streaming.

A unary call whose method offers `start`/`finish` (ModelInfer) runs without a task: `start` returns
the data plane's future and the answer is written from its done-callback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from .hpack_codec import encode

log = logging.getLogger("inferd.grpc")

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
INTERNAL = 13
UNAVAILABLE = 14
UNIMPLEMENTED = 12
RESOURCE_EXHAUSTED = 8

_PREFIX = struct.Struct(">BI")
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


@dataclass(frozen=True)
class Method:
    """One RPC. `handler(request, context)` is a coroutine (unary) or an async generator over a
    request iterator (stream); `encode` None means the handler already answers bytes. `start` and
    `finish` give a unary method the task-free path: start(request) -> (future, state), and
    finish(result, state) -> (message pieces, size)."""

    streaming: bool
    handler: Callable[..., Any]
    decode: Callable[[Any], Any]  # bytes or bytearray -> request
    encode: Callable[[Any], bytes] | None = None
    start: Callable[[Any], tuple[asyncio.Future[Any], Any]] | None = None
    finish: Callable[[Any, Any], tuple[list[Any], int]] | None = None
    errors: Callable[[BaseException], tuple[int, str] | None] | None = None  # exception -> status, else INTERNAL


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
    return [_PREFIX.pack(0, len(message)), message]


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
        flag, length = _PREFIX.unpack(prefix)
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


class Context:
    """What handlers get as `context`: the call's metadata, and `abort`."""

    __slots__ = ("metadata",)

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.metadata)

    async def abort(self, code: Any, details: str = "") -> None:
        raise Abort(status_of_code(code), details)


class Call:
    """Shared by unary and streaming calls: the stream, its deadline, and ending with a status."""

    def __init__(
        self, server: Any, conn: Any, sid: int, method: Method, metadata: list[tuple[str, str]],
        timeout: float | None, encoding: str | None,
    ) -> None:
        self.server = server
        self.conn = conn
        self.sid = sid
        self.method = method
        self.context = Context(metadata)
        self.deframer = Deframer(server.max_message_bytes, encoding)
        self.done = False
        self.held = 0  # bytes of an unfinished request message counted in the connection's budget
        self.headers_sent = False
        self.timer: asyncio.TimerHandle | None = None
        if timeout is not None:
            self.timer = asyncio.get_running_loop().call_later(timeout, self._deadline)
        server.calls.add(self)

    def _deadline(self) -> None:
        self.timer = None
        if not self.done:
            self.cancel()
            self.end(DEADLINE_EXCEEDED, "Deadline Exceeded")

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    def on_reset(self) -> None:
        if not self.done:
            self._finished()
            self.cancel()

    def end(self, code: int, message: str = "") -> None:
        if self.done:
            return
        if self.headers_sent:
            self.conn.send_trailers(self.sid, trailers(code, message))
        else:
            self.conn.send_headers(self.sid, trailers_only(code, message), end_stream=True)
        self._finished()

    def _track_partial(self) -> None:
        """An unfinished request message counts against its connection's budget (connection.hold)."""
        held = self.deframer.buffered
        if held != self.held:
            delta, self.held = held - self.held, held
            if not self.conn.hold(self.sid, delta):
                raise Abort(RESOURCE_EXHAUSTED, "too many bytes of unfinished request messages on this connection")

    def _finished(self) -> None:
        self.done = True
        if self.held:
            self.conn.hold(self.sid, -self.held)
            self.held = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server.call_done(self)

    def fail(self, exc: BaseException) -> None:
        code, message = self.status_for(exc)
        self.end(code, message)

    def status_for(self, exc: BaseException) -> tuple[int, str]:
        if isinstance(exc, Abort):
            return exc.code, exc.message
        if self.method.errors is not None:
            mapped = self.method.errors(exc)
            if mapped is not None:
                return mapped
        log.error("gRPC handler failed", exc_info=exc)
        return INTERNAL, "internal error"


class UnaryCall(Call):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.started = False
        self.future: asyncio.Future[Any] | None = None

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        if self.done:
            return
        try:
            if payload:
                messages = self.deframer.feed(payload)
                self._track_partial()
                self.conn.acknowledge(self.sid, len(payload))
                if messages and not self.started:
                    self.started = True
                    self._start(messages[0])
            if end_stream and not self.started:
                self.end(UNIMPLEMENTED if self.deframer.idle else INTERNAL, "Missing request message")
        except Exception as exc:
            self.fail(exc)

    def _start(self, data: bytes | bytearray) -> None:
        method = self.method
        request = method.decode(data)
        if method.start is not None:
            future, state = method.start(request)
            self.future = future
            future.add_done_callback(lambda fut: self._answer(fut, state))
        else:
            self.future = asyncio.ensure_future(self._run(request))

    async def _run(self, request: Any) -> None:
        try:
            result = await self.method.handler(request, self.context)
            data = result if self.method.encode is None else self.method.encode(result)
            self.respond(*frame_message_sized(data))
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.fail(exc)

    def _answer(self, future: asyncio.Future[Any], state: Any) -> None:
        if self.done or future.cancelled():
            return
        try:
            pieces, size = self.method.finish(future.result(), state)  # type: ignore[misc]
        except Exception as exc:
            self.fail(exc)
            return
        self.respond([_PREFIX.pack(0, size), *pieces], size + 5)

    def respond(self, pieces: list[Any], size: int) -> None:
        if self.done:
            return
        self.conn.respond(self.sid, RESPONSE_HEAD, pieces, size, TRAILERS_OK)
        self._finished()

    def cancel(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.cancel()


def frame_message_sized(data: bytes | memoryview) -> tuple[list[Any], int]:
    return [_PREFIX.pack(0, len(data)), data], len(data) + 5


_END = object()
INBOX_MESSAGES = 256  # stream requests read but not yet taken by the handler before the client must wait
INBOX_BYTES = 4 * 1024 * 1024  # ... or this many bytes of them


class StreamCall(Call):
    """A bidirectional stream: requests are decoded as they arrive and read by the handler's
    iterator (their bytes are given back to the client's window when read); each answer the
    handler yields is written as one message, waiting while the socket's buffer is full or the
    client's flow-control window holds the previous one back."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.unacked = 0  # bytes received while the inbox was full: given back as it empties
        self.inbox_bytes = 0
        self.task = asyncio.ensure_future(self._run())

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        if self.done:
            return
        try:
            if payload:
                for message in self.deframer.feed(payload):
                    self.inbox.put_nowait(message)
                    self.inbox_bytes += len(message)
                self._track_partial()
                self.unacked += len(payload)
                self._give_back()
            if end_stream:
                self.inbox.put_nowait(_END)
        except Exception as exc:
            self.cancel()
            self.fail(exc)

    def _give_back(self) -> None:
        if self.unacked and self.inbox.qsize() < INBOX_MESSAGES and self.inbox_bytes < INBOX_BYTES:
            self.conn.acknowledge(self.sid, self.unacked)
            self.unacked = 0

    async def _requests(self) -> AsyncIterator[Any]:
        decode = self.method.decode
        while True:
            message = await self.inbox.get()
            if message is _END:
                return
            self.inbox_bytes -= len(message)
            self._give_back()
            yield decode(message)

    async def _run(self) -> None:
        conn, sid = self.conn, self.sid
        encode_ = self.method.encode
        try:
            async for answer in self.method.handler(self._requests(), self.context):
                if self.done:
                    return
                if not self.headers_sent:
                    self.headers_sent = True
                    conn.send_headers(sid, RESPONSE_HEAD)
                data = answer if encode_ is None else encode_(answer)
                conn.send_data(sid, frame_message(data))
                if not conn.writable:
                    await conn.drain()
                await conn.sent(sid)
            self.end(OK)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.fail(exc)

    def cancel(self) -> None:
        if not self.task.done():
            self.task.cancel()

