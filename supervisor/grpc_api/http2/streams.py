"""The stream side of an HTTP/2 connection: what a stream's handler implements and the per-stream state
the connection keeps (windows both ways, DATA waiting for window, trailers)."""

from __future__ import annotations

import asyncio
from typing import Protocol

STREAM_WINDOW = 4 * 1024 * 1024  # what a client may send on one stream before we acknowledge


class StreamHandler(Protocol):
    def on_data(self, payload: memoryview, end_stream: bool) -> None: ...
    def on_reset(self) -> None: ...


class Stream:
    __slots__ = (
        "id",
        "handler",
        "send_window",
        "pending",
        "trailers",
        "remote_closed",
        "recv_window",
        "consumed",
        "sent",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.handler: StreamHandler | None = None
        self.send_window = send_window
        self.pending: list[memoryview] = []  # DATA waiting for window
        self.trailers: bytes | None = None  # header block to send once `pending` is out
        self.remote_closed = False
        self.recv_window = STREAM_WINDOW  # what the client may still send
        self.consumed = 0  # bytes the handler is done with, not yet given back with WINDOW_UPDATE
        self.sent: asyncio.Future[None] | None = None  # set once `pending` is out (see `sent`)

    def wake(self) -> None:
        sent, self.sent = self.sent, None
        if sent is not None and not sent.done():
            sent.set_result(None)
