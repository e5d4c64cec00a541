"""gRPC calls on an HTTP/2 stream: the method table entry, the handler's context, deadlines, and the
two kinds of call this service has: unary and bidirectional streaming (framing in grpc_wire.py).

A unary call whose method offers `start`/`finish` (ModelInfer) runs without a task: `start` returns
the data plane's future and the answer is written from its done-callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .grpc_wire import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    MESSAGE_PREFIX,
    OK,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEAD,
    TRAILERS_OK,
    UNIMPLEMENTED,
    Abort,
    Deframer,
    frame_message,
    single_message,
    status_of_code,
    trailers,
    trailers_only,
)

log = logging.getLogger("inferd.grpc")


@dataclass(frozen=True)
class Method:
    """One RPC. `handler(request, context)` is a coroutine (unary) or an async generator over a
    request iterator (stream); `encode` None means the handler already answers bytes. `start` and
    `finish` give a unary method the task-free path: start(request, context) -> (future, state), and
    finish(result, state) -> (message pieces, size). `rule`: the RPC is restricted (an
    access.Restriction); the server refuses calls whose metadata does not satisfy it."""

    streaming: bool
    handler: Callable[..., Any]
    decode: Callable[[Any], Any]  # bytes or bytearray -> request
    encode: Callable[[Any], bytes] | None = None
    start: Callable[[Any, Context], tuple[asyncio.Future[Any], Any]] | None = None
    finish: Callable[[Any, Any], tuple[list[Any], int]] | None = None
    errors: Callable[[BaseException], tuple[int, str] | None] | None = None  # exception -> status, else INTERNAL
    rule: Any = None


class Context:
    """What handlers get as `context`: the call's metadata, and `abort`."""

    __slots__ = ("metadata",)

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.metadata = metadata  # shared by the calls of one header block: a tuple, never changed

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.metadata)  # the same object when it is a tuple already

    async def abort(self, code: Any, details: str = "") -> None:
        raise Abort(status_of_code(code), details)


class Call:
    """Shared by unary and streaming calls: the stream, its deadline, and ending with a status."""

    __slots__ = ("server", "conn", "sid", "method", "context", "encoding", "_deframer", "done", "held",
                 "headers_sent", "timer", "started", "future", "state")

    def __init__(
        self, server: Any, conn: Any, sid: int, method: Method, context: Context, timeout: float | None,
        encoding: str | None,
    ) -> None:
        self.server = server
        self.conn = conn
        self.sid = sid
        self.method = method
        self.context = context  # shared by the calls of one header block (native_server.open_stream)
        self.encoding = encoding
        self._deframer: Deframer | None = None  # made when a message does not come whole in one frame
        self.done = False
        self.held = 0  # bytes of an unfinished request message counted in the connection's budget
        self.headers_sent = False
        self.timer: asyncio.TimerHandle | None = None
        # a unary call's (here, not in UnaryCall.__init__: one frame less per call)
        self.started = False
        self.future: asyncio.Future[Any] | None = None
        self.state: Any = None  # what method.start gave, for method.finish
        if timeout is not None:
            self.timer = asyncio.get_running_loop().call_later(timeout, self._deadline)
        server.calls.add(self)

    @property
    def deframer(self) -> Deframer:
        if self._deframer is None:
            self._deframer = Deframer(self.server.max_message_bytes, self.encoding)
        return self._deframer

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
        server = self.server
        calls = server.calls
        calls.discard(self)
        if not calls and server.idle is not None:  # server.call_done, inline (one call less per call)
            server.idle.set()

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
    __slots__ = ()

    def on_data(self, payload: memoryview, end_stream: bool) -> None:
        if self.done:
            return
        try:
            if payload:
                if end_stream and not self.started and self._deframer is None:
                    # the common call: its one message in one DATA frame, nothing held before it (nothing
                    # to hold or give back either: the stream's window is done with)
                    message = single_message(payload, self.server.max_message_bytes)
                    if message is not None:
                        self.started = True
                        self._start(message)
                        return
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
            future, self.state = method.start(request, self.context)
            self.future = future
            future.add_done_callback(self._answer)
        else:
            self.future = asyncio.ensure_future(self._run(request))

    async def _run(self, request: Any) -> None:
        try:
            result = await self.method.handler(request, self.context)
            data = result if self.method.encode is None else self.method.encode(result)
            self.respond(frame_message(data), len(data) + 5)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.fail(exc)

    def _answer(self, future: asyncio.Future[Any]) -> None:
        if self.done or future.cancelled():
            return
        try:
            pieces, size = self.method.finish(future.result(), self.state)  # type: ignore[misc]
        except Exception as exc:
            self.fail(exc)
            return
        # respond(), inline (one call less per answer)
        if not self.conn.respond(self.sid, RESPONSE_HEAD, [MESSAGE_PREFIX.pack(0, size), *pieces], size + 5,
                                 TRAILERS_OK):
            self.end(RESOURCE_EXHAUSTED, "too many response bytes wait for this connection's flow-control window")
            return
        self._finished()

    def respond(self, pieces: list[Any], size: int) -> None:
        if self.done:
            return
        if not self.conn.respond(self.sid, RESPONSE_HEAD, pieces, size, TRAILERS_OK):
            self.end(RESOURCE_EXHAUSTED, "too many response bytes wait for this connection's flow-control window")
            return
        self._finished()

    def cancel(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.cancel()


_END = object()
INBOX_MESSAGES = 256  # stream requests read but not yet taken by the handler before the client must wait
INBOX_BYTES = 4 * 1024 * 1024  # ... or this many bytes of them


class StreamCall(Call):
    """A bidirectional stream: requests are decoded as they arrive and read by the handler's
    iterator (their bytes are given back to the client's window when read); each answer the
    handler yields is written as one message, waiting while the socket's buffer is full or the
    client's flow-control window holds the previous one back."""

    __slots__ = ("inbox", "unacked", "inbox_bytes", "task")

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

