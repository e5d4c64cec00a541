"""How an HTTP/1.1 connection ends: the per-connection half of the timeouts (slow headers, a body without
progress, idle keep-alive; the server's sweeper calls `check_timeouts`), protocol errors answered before
closing (what the client still sends drains for a while, bounded), and close or abort."""

from __future__ import annotations

import time

from .connection_state import BODY, DRAIN, HEADERS, IDLE, ConnectionState
from .response_bytes import error_bytes

LINGER_S = 2.0  # how long a connection answered with a fatal error keeps draining input


class ConnectionLifetime(ConnectionState):
    @property
    def idle(self) -> bool:
        return self.state == IDLE and not self._busy and not self._queue

    def close(self) -> None:
        if not self.closed and self._transport is not None:
            self.closed = True
            self._coalescer.release(self._transport)
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self.closed = True
            self._coalescer.drop(self._transport)
            self._transport.abort()

    def _fatal(self, status: int, message: str) -> None:
        """Answer a protocol-level error, stop parsing, and close once the client is done sending."""
        if self.closed or self._transport is None:
            return
        self.state = DRAIN
        self.since = time.monotonic()
        self._queue.clear()
        self._body = None  # what was read of a refused body goes at once, not when the connection does
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._pending is not None:
            self._pending.cancel()
            self._pending = self._pending_req = self._pending_deferred = None
        self._busy = False
        transport = self._transport
        self._coalescer.release(transport)
        if status:
            transport.write(error_bytes(status, message))
        try:
            if transport.can_write_eof():
                transport.write_eof()  # half-close: the client reads the answer, its sends still drain
        except (OSError, RuntimeError):
            pass
        self._resume_reading()

    def check_timeouts(self, now: float) -> None:
        srv = self._server
        state = self.state
        if state == IDLE:
            if not self._busy and not self._queue and now - self.since > srv.keepalive_timeout:
                self.close()
        elif state == HEADERS:
            if now - self.since > srv.header_timeout:
                self._timeout()
        elif state == BODY:
            # since the last progress (the head, body bytes: request_reader), not the last read: a client that
            # keeps sending chunk framing or trailer bytes without finishing is cut off too
            if now - self.since > srv.body_timeout and not (self._expect and (self._busy or self._queue)):
                self._timeout()
        elif state == DRAIN and now - self.since > min(LINGER_S, srv.body_timeout):
            self.abort()

    def _timeout(self) -> None:
        if self._busy or self._queue:
            self.abort()  # an earlier response is still pending: do not write out of order
        else:
            self._fatal(408, "request timeout")
            self.abort()
