"""The coalescer on real socket transports: the first answer of a pass leaves at once, the next ones
together when the pass is over, and `release` keeps a transport's bytes in order."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop
from inferd.supervisor.http_api.request_cycle import Coalescer

LOOPS = pytest.mark.parametrize("new_loop", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])


def _readable(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""


async def _pair(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Transport, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    return transport, theirs  # type: ignore[return-value]


async def _until(sock: socket.socket, size: int) -> bytes:
    got = b""
    for _ in range(1000):  # a few loop passes are enough; bounded so a bug fails instead of hanging
        got += _readable(sock)
        if len(got) >= size:
            return got
        await asyncio.sleep(0)
    return got


@LOOPS
def test_first_answer_at_once_later_ones_at_the_end_of_the_pass(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        coalescer = Coalescer(loop)
        (t1, s1), (t2, s2) = await _pair(loop), await _pair(loop)
        coalescer.write(t1, b"first")
        assert _readable(s1) == b"first"  # written within the call
        coalescer.write(t2, b"second")
        coalescer.write(t1, b"third")
        assert coalescer.held and _readable(s2) == b"" and _readable(s1) == b""
        assert await _until(s2, 6) == b"second" and await _until(s1, 5) == b"third"
        assert not coalescer.held
        coalescer.write(t2, b"next pass")  # a new pass: at once again
        assert _readable(s2) == b"next pass"
        for t, s in ((t1, s1), (t2, s2)):
            t.close()
            s.close()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(run())


@LOOPS
def test_release_and_drop_keep_order(new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        coalescer = Coalescer(loop)
        (t1, s1), (t2, s2) = await _pair(loop), await _pair(loop)
        coalescer.write(t1, b"a")
        coalescer.write(t2, b"b")
        coalescer.write(t2, b"c")
        coalescer.release(t2)  # e.g. a large answer follows: what is held goes first
        t2.write(b"D")
        assert await _until(s2, 3) == b"bcD"
        coalescer.write(t1, b"e")
        coalescer.drop(t1)  # aborted connection: nothing held is written
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert await _until(s1, 1) == b"a" and _readable(s1) == b""
        for t, s in ((t1, s1), (t2, s2)):
            t.close()
            s.close()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(run())
