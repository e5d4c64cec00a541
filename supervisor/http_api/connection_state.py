"""What one HTTP/1.1 connection knows: its server (ConnectionHost), its read state and the request being
read, the requests waiting behind the running one, and its flow-control flags.

HttpConnection (connection.py) is assembled from three parts that share this state: request_reader.py
(the httptools callbacks and the header and body caps), response_writer.py (answers written in order,
back-pressure) and connection_lifetime.py (timeouts, protocol errors, close). They are mixins over one
object, not separate objects: the request path stays one attribute lookup deep.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import httptools

if TYPE_CHECKING:
    from .coalesce import Coalescer
    from .messages import Deferred, Handler, Request, Response


class ConnectionHost(Protocol):
    """What a connection reads from the server that accepted it (server.py's HttpServer)."""

    handler: Handler
    loop: asyncio.AbstractEventLoop
    coalescer: Coalescer
    max_body: int
    max_pipelined: int
    max_connections: int
    max_header_size: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    closing: bool
    connections: set[Any]

    def _admit(self, conn: Any) -> bool: ...
    def _forget(self, conn: Any) -> None: ...


# connection states
IDLE = 0  # between requests
HEADERS = 1  # request line / headers being read
BODY = 2  # body being read
DRAIN = 3  # an error was answered; incoming bytes are discarded until the client closes
CLOSING = 4  # the connection's last request was read (no keep-alive, or CONNECT): what follows is dropped


def new_parser(protocol: object) -> httptools.HttpRequestParser:
    """A request parser that reads a chunked body beside a Content-Length (request_reader.py checks the rest)."""
    parser = httptools.HttpRequestParser(protocol)
    lenient = getattr(parser, "set_dangerous_leniencies", None)  # (httptools >= 0.6.2; older ones refuse CL+TE)
    if lenient is not None:
        lenient(lenient_chunked_length=True)
    return parser


class Refused:
    """A pipelined request beyond the connection's limit: answered with `res` in its turn, never run."""

    __slots__ = ("req", "res")

    def __init__(self, req: Request, res: Response) -> None:
        self.req = req
        self.res = res


class ConnectionState(asyncio.Protocol):
    """The fields every part of a connection reads and writes."""

    def __init__(self, server: ConnectionHost) -> None:
        self._server = server
        self._handler = server.handler
        self._loop = server.loop
        self._coalescer = server.coalescer
        self._parser = new_parser(self)
        self._transport: asyncio.Transport | None = None
        self.state = IDLE
        self.since = time.monotonic()  # start of the current state (idle / headers) or last read
        self.last_read = self.since
        # request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._raw: list[tuple[str, str]] | None = None  # headers as received (KeepCaseConnection)
        self._hbytes = 0
        self._hraw = 0  # bytes read since the last progress (a head, body bytes): capped as a head is
        self._completed = 0
        self._clen = -1
        self._cap = server.max_body  # of the request being read (its JSON header adds to it)
        self._body: Any = None
        self._blen = 0
        self._expect = False
        # the last request's head, when it can be read again without the parser (request_reader.py)
        self._head: bytes | None = None
        self._head_parsed: tuple[str, str, str, dict[str, str], int] | None = None
        self._read: bytes | None = None  # the read being parsed, when it began at a request's start
        # a request that asked for Upgrade (or CONNECT) while its body is read (request_reader._after_upgrade)
        self._held: tuple[bytes, bool, bytes, dict[str, str], list[tuple[str, str]] | None] | None = None
        self._max_pipelined = server.max_pipelined
        self._max_header_size = server.max_header_size
        self._max_headers = server.max_headers
        # requests parsed and waiting (or the 503s owed to those beyond max_pipelined), and the one running
        self._queue: deque[Request | Refused] = deque()
        self._busy = False
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[Any] | None = None  # the Deferred future the running request waits on
        self._pending_req: Request | None = None  # ... its request, and the Deferred
        self._pending_deferred: Deferred | None = None
        self._paused_reading = False
        self._paused_writing = False
        self._write_ready: asyncio.Future[None] | None = None
        self._eof = False
        self._drained = 0  # bytes read and dropped after a fatal error
        self.closed = False
        self.admitted = False  # counted in the server's open connections (HttpServer._admit)

    if TYPE_CHECKING:  # what each part calls in another (defined in the mixins)
        def _fatal(self, status: int, message: str) -> None: ...
        def _finish(self, req: Request, res: Response) -> bool: ...
        def _dispatch(self, item: Request | Refused) -> None: ...
        def _send_continue(self) -> None: ...
        def _write(self, transport: asyncio.Transport, res: Response, keep: bool, conn_hdr: str | None) -> None: ...
        def _pause_reading(self) -> None: ...
        def _resume_reading(self) -> None: ...
        def close(self) -> None: ...
        def abort(self) -> None: ...
