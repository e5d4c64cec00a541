"""Writing answers on an HTTP/1.1 connection: one sized response (small ones joined and handed to
coalesce.py, large ones written buffer by buffer), a chunked body produced while it is written, `100
Continue`, and back-pressure both ways (a client that does not read stops us reading its requests, and
answers wait until its socket drains)."""

from __future__ import annotations

import asyncio
from typing import Any

from .connection_state import ConnectionState
from .messages import Request, Response
from .response_bytes import CONTINUE, chunked_head, json_ok, response_head

SMALL = 65536  # a response up to this size is joined into one buffer


class ResponseWriter(ConnectionState):
    # ---- asyncio.Protocol flow control ----
    def pause_writing(self) -> None:
        self._paused_writing = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None
        if len(self._queue) < self._max_pipelined:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if not self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._paused_reading and self._transport is not None and not self.closed:
            self._paused_reading = False
            self._transport.resume_reading()

    async def _write_when_ready(self, req: Request, res: Response) -> None:
        """The client is not reading: wait for the transport to drain before writing more."""
        self._write_ready = self._loop.create_future()
        await self._write_ready
        self._task = None
        if self.closed:
            return
        if self._finish(req, res):
            self._dispatch(self._queue.popleft())

    # ---- the bytes ----
    def _write(self, transport: asyncio.Transport, res: Response, keep: bool, conn_hdr: str | None) -> None:
        body: Any = res.body
        if (type(body) is bytes and keep and conn_hdr is None and res.status == 200 and res.headers is None
                and body and len(body) <= SMALL and res.content_type == "application/json"):
            self._coalescer.write(transport, json_ok(body))  # the common answer, its head from a template
            return
        if type(body) is bytes:
            single, size = True, len(body)
        else:
            single = isinstance(body, (bytearray, memoryview))
            size = memoryview(body).nbytes if single else sum(memoryview(b).nbytes for b in body)
        head = response_head(res, size, keep, conn_hdr)
        if size <= SMALL:
            # one small write: joining is cheaper than handing several buffers to the transport
            if single:
                head.append(body)
            else:
                head.extend(body)
            self._coalescer.write(transport, b"".join(head))
            return
        self._coalescer.release(transport)
        if single:
            transport.write(b"".join(head))
            transport.write(body)
        else:
            transport.write(b"".join(head))
            for part in body:
                transport.write(part)

    async def _write_chunks(self, req: Request, res: Any) -> bool:
        """A body produced while it is written (`res.chunks`, an async iterator of bytes): chunked
        transfer encoding, waiting while the client does not read. True when the body ended and the
        connection stays open for the next request (keep-alive, as Triton's generate_stream and what HTTP
        clients such as httpx expect); otherwise the connection is closed here."""
        # stays _busy meanwhile (the idle sweeper leaves it alone); requests pipelined behind the stream
        # wait in the queue and are answered after it
        transport = self._transport
        assert transport is not None
        keep = req.keep_alive and not self._server.closing and not self._eof
        if not keep:
            self._queue.clear()
        chunks = res.chunks
        coalescer = self._coalescer
        # Every chunk goes through the coalescer: the first write of an event-loop pass leaves at once (a lone
        # token waits for nothing); what follows in the same pass (this stream's tokens already queued, other
        # streams' tokens) leaves joined at the pass's end: one send per connection and pass, not per event.
        head: bytes | None = chunked_head(res.status, res.content_type, res.headers, keep)  # leaves with a chunk
        ended = False
        try:
            async for chunk in chunks:
                if self.closed:
                    return False
                if chunk:  # an empty chunk would end the body
                    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    if head is not None:
                        frame, head = head + frame, None
                    coalescer.write(transport, frame)
                if self._paused_writing:
                    coalescer.release(transport)
                    self._write_ready = self._loop.create_future()
                    await self._write_ready
            if not self.closed:
                coalescer.write(transport, b"0\r\n\r\n" if head is None else head + b"0\r\n\r\n")
                ended = True
        finally:
            await chunks.aclose()
            self._task = None
            keep = ended and keep and not self._server.closing  # (a shutdown that began meanwhile ends it)
            if not keep:
                self.close()
        return keep and not self.closed

    def _send_continue(self) -> None:
        self._expect = False
        if self._transport is not None and not self.closed:
            self._coalescer.release(self._transport)
            self._transport.write(CONTINUE)
