"""What passes between an HTTP/1.1 connection and its handlers, and how it leaves: the Request and Response
objects (and the Deferred answer of an inference), the bytes of a response (status lines, the head of a
sized or chunked response, the short JSON error a connection answers before closing), and the Coalescer
that lets the small answers of one event-loop pass leave together. connection.py and request_cycle.py do
the I/O.

Why coalesce: the second and later small HTTP responses of an event-loop pass leave together at its end.
A batch's results answer many connections in one pass. Each write to a client whose thread sleeps
on another, idle CPU wakes that CPU, and on a virtual machine the writer pays for the wake-up inside
the send call (more than half of its cost here). Written back to back at the end of the pass, the
responses find the client still awake reading the previous one. The first answer of a pass leaves at
once: a lone answer (one client, one request) waits for nothing.

A flush scheduled with call_soon runs on the loop's next pass, after the I/O callbacks of that pass;
so a connection that reads a request first writes out what is held (`flush`, when `held`), and no
request is parsed while answers wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, Union


class Request:
    """One parsed request. Header names are lower-cased; `body` is bytes-like. `raw_headers` holds every
    header as received (names as the client spelled them, repeats included) when the server keeps them
    (HttpServer keep_header_case, for --http-header-forward-pattern), else None."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "raw_headers")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: Any,
                 keep_alive: bool, raw_headers: list[tuple[str, str]] | None = None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.raw_headers = raw_headers


class Response:
    """Status, body (bytes, or a sequence of buffers written without joining) and headers."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int = 200, body: bytes | Sequence[Any] = b"",
                 content_type: str | None = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class Deferred:
    """A response that `finish(context, future)` builds once `future` is done. The connection waits for it
    with a done-callback instead of running a task per request (cheaper); cancelling `future` abandons it."""

    __slots__ = ("future", "finish", "context")

    def __init__(self, future: asyncio.Future[Any], finish: Callable[[Any, asyncio.Future[Any]], Response],
                 context: Any = None) -> None:
        self.future = future
        self.finish = finish
        self.context = context


HandlerResult = Union[Response, Deferred, Awaitable[Response]]
Handler = Callable[[Request], HandlerResult]


# ---- the bytes of a response ----

def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# content type -> its header line: one dict lookup per response (bounded: handlers choose the types)
_CONTENT_TYPES: dict[str, bytes] = {}
_CACHE_MAX = 256


def error_bytes(status: int, message: str) -> bytes:
    body = ('{{"error":"{}"}}'.format(message.replace("\\", "\\\\").replace('"', '\\"'))).encode()
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: ",
        str(len(body)).encode(), b"\r\n\r\n", body,
    ))


def response_head(res: Any, size: int, keep: bool, conn_hdr: str | None) -> list[bytes]:
    """Status line and headers of a response with a `size`-byte body, ending with the blank line."""
    head = [STATUS_LINES.get(res.status) or _status_line(res.status)]
    ctype = res.content_type
    if ctype is not None and size:
        line = _CONTENT_TYPES.get(ctype)
        if line is None:
            line = b"Content-Type: %s\r\n" % ctype.encode("latin-1")
            if len(_CONTENT_TYPES) < _CACHE_MAX:
                _CONTENT_TYPES[ctype] = line
        head.append(line)
    if res.headers:
        for k, v in res.headers.items():
            head.append(f"{k}: {v}\r\n".encode("latin-1"))
    if not keep:
        head.append(b"Connection: close\r\n")
    elif conn_hdr is not None and conn_hdr.lower() == "keep-alive":
        head.append(b"Connection: keep-alive\r\n")  # HTTP/1.0 clients asking for keep-alive
    head.append(b"Content-Length: %d\r\n\r\n" % size)
    return head


_JSON_OK = STATUS_LINES[200] + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


def json_ok(body: bytes) -> bytes:
    """A whole 200 response with a non-empty JSON body on a kept-alive connection whose client did not
    send `Connection` (the common answer): the bytes response_head and the body make, in one step."""
    return _JSON_OK % (len(body), body)


def chunked_head(status: int, content_type: str | None, headers: dict[str, str] | None = None,
                 keep: bool = False) -> bytes:
    """The head of a body written as it is produced (chunked); `keep`: the connection stays open after it."""
    extra = [f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()] if headers else []
    return b"".join((
        STATUS_LINES.get(status) or _status_line(status),
        b"Content-Type: %s\r\n" % (content_type or "application/octet-stream").encode("latin-1"),
        *extra,
        b"Cache-Control: no-cache\r\n",
        b"" if keep else b"Connection: close\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n"))


# ---- small answers of one pass leave together ----

class Coalescer:
    """Writes the first small answer of a pass at once and holds the following ones, per transport,
    until the pass is over. Any other write to, or close of, a transport must `release` it first, so
    its bytes keep their order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.waiting: dict[asyncio.Transport, list[bytes]] = {}  # answers held, per transport
        self._in_pass = False  # an answer has been written in this pass: hold the next ones

    @property
    def held(self) -> bool:
        return bool(self.waiting)

    def write(self, transport: asyncio.Transport, data: bytes) -> None:
        if not self._in_pass:
            self._in_pass = True
            self._loop.call_soon(self.flush)
            transport.write(data)
            return
        held = self.waiting
        parts = held.get(transport)
        if parts is None:
            held[transport] = [data]
        else:
            parts.append(data)

    def release(self, transport: asyncio.Transport) -> None:
        """Write what is held for `transport` now."""
        parts = self.waiting.pop(transport, None)
        if parts and not transport.is_closing():
            transport.write(b"".join(parts))

    def drop(self, transport: asyncio.Transport) -> None:
        """Forget what is held for `transport` (aborted or lost)."""
        self.waiting.pop(transport, None)

    def flush(self) -> None:
        self._in_pass = False
        held, self.waiting = self.waiting, {}
        for transport, parts in held.items():
            if not transport.is_closing():
                transport.write(parts[0] if len(parts) == 1 else b"".join(parts))
