"""Run the HTTP frontend in a background event loop (uvloop) so blocking clients can drive it."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
import uvloop
from inferd.supervisor.http_api import HttpServer, start_http_api, start_metrics_server

from .fake_dataplane import FakeDataPlane

MAX_INPUT = 1 << 20  # a small body cap keeps the size-limit tests fast
SHORT_TIMEOUT = 0.3


class LoopThread:
    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Served:
    def __init__(self, lt: LoopThread, server: HttpServer, dp: FakeDataPlane) -> None:
        self.lt = lt
        self.server = server
        self.dp = dp
        self.port = server.port
        self.url = f"127.0.0.1:{server.port}"

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return s


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


def _serve(lt: LoopThread, **kw: Any) -> Iterator[Served]:
    dp = FakeDataPlane()

    async def start() -> HttpServer:
        return await start_http_api(dp, "127.0.0.1", 0, max_input_size=MAX_INPUT, **kw)

    server = lt.run(start())
    yield Served(lt, server, dp)
    lt.run(server.wait_closed(2.0))


@pytest.fixture(scope="session")
def served(loop_thread: LoopThread) -> Iterator[Served]:
    yield from _serve(loop_thread)


@pytest.fixture(scope="session")
def short_served(loop_thread: LoopThread) -> Iterator[Served]:
    """A server whose header/body/idle timeouts are short, for slow-client tests."""
    yield from _serve(loop_thread, header_timeout=SHORT_TIMEOUT, body_timeout=SHORT_TIMEOUT,
                      keepalive_timeout=SHORT_TIMEOUT)


@pytest.fixture(scope="session")
def metrics_served(loop_thread: LoopThread) -> Iterator[Served]:
    dp = FakeDataPlane()
    server = loop_thread.run(start_metrics_server(dp, "127.0.0.1", 0))
    yield Served(loop_thread, server, dp)
    loop_thread.run(server.wait_closed(2.0))


@pytest.fixture
def client(served: Served) -> Iterator[Any]:
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(served.url, connection_timeout=10, network_timeout=10)
    yield c
    c.close()
