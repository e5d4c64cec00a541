"""A request whose handler answers with an awaitable is cancelled when a protocol error ends its connection
(connection.py `_fatal`: the error answer written, then the write half closed). The cancelled run must not
write its own "request cancelled" answer after that: on uvloop the write raised "Cannot call write() after
write_eof()" in the task, logged as "Task exception was never retrieved" (found while issue 36 cut the
connection by lifetime)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop
from inferd.supervisor.http_api.connection import HttpConnection
from inferd.supervisor.http_api.request_cycle import Response
from inferd.supervisor.http_api.server import HttpServer

from .test_head_reuse import Transport


class HalfClosing(Transport):
    """As uvloop's transports: no write once the write half is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.eof = False

    def write(self, data: Any) -> None:
        if self.eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        super().write(data)

    def write_eof(self) -> None:
        super().write_eof()
        self.eof = True


async def scenario() -> tuple[BaseException | None, bytes]:
    never = asyncio.Event()

    async def slow() -> Response:
        await never.wait()
        return Response(200, b"{}")

    server = HttpServer(lambda req: slow(), max_body=4096)
    conn, transport = HttpConnection(server), HalfClosing()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(b"GET /v2/repository/index HTTP/1.1\r\nHost: h\r\n\r\n")
    cycle = conn._cycle
    assert cycle is not None and cycle.task is not None, "the handler's awaitable runs in a task"
    task = cycle.task
    await asyncio.sleep(0)  # the task starts waiting
    conn.data_received(b"\x01\x02 not http\r\n\r\n")  # a protocol error: 400, write half closed
    await asyncio.wait([task], timeout=10)
    assert task.done(), "the cancelled run ended"
    return (None if task.cancelled() else task.exception()), bytes(transport.out)


def test_a_cancelled_run_writes_nothing_after_the_connection_failed() -> None:
    error, out = uvloop.run(scenario())
    assert error is None, f"the cancelled run raised {error!r}"
    assert out.startswith(b"HTTP/1.1 400 ") and out.endswith(b"<EOF>") and out.count(b"HTTP/1.1") == 1
