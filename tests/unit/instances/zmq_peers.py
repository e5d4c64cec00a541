"""Real libzmq DEALER sockets playing workers against the channel, for the channel and ZMTP tests."""

from __future__ import annotations

import asyncio

import zmq


def dealer(ctx: zmq.Context, endpoint: str, identity: str, **opts: int) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.LINGER, 0)
    for name, value in opts.items():
        s.setsockopt(getattr(zmq, name), value)
    s.connect(endpoint)
    return s


async def recv(sock: zmq.Socket, timeout: float = 10.0) -> list[bytes]:
    """The next message on `sock`, polled without blocking the event loop that serves the channel."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if sock.poll(0):
            return sock.recv_multipart()
        await asyncio.sleep(0.002)
    raise TimeoutError
