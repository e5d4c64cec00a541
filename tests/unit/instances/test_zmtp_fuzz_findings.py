"""What fuzz/targets/zmtp_frames.py found in ZMTP framing, one test each (the input is in its corpus)."""

from __future__ import annotations

import asyncio
import socket
import threading
import tracemalloc

import pytest
from inferd.worker.wire import zmtp
from inferd.worker.zmtp_socket import DealerSocket, LinkClosed

# a data frame (MORE: the message goes on) before the peer's READY, then READY, then the message's last frame
EARLY_FRAME = zmtp.frame_header(zmtp.MORE, 5) + b"early"
LATE_FRAME = zmtp.frame_header(0, 4) + b"late"


async def test_a_data_frame_before_ready_is_dropped_by_the_supervisor(channel):
    """It was held until READY and joined the first message after it: the worker got [early, late]."""
    got: list[list[bytes]] = []
    broken: asyncio.Queue[str] = asyncio.Queue()
    channel.register("w", lambda frames: got.append([bytes(f) for f in frames]), lambda frames: None,
                     broken.put_nowait)
    loop = asyncio.get_running_loop()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.setblocking(False)
    try:
        await loop.sock_connect(raw, channel.path)
        await loop.sock_sendall(raw, zmtp.GREETING + EARLY_FRAME + zmtp.ready(b"DEALER", b"w") + LATE_FRAME)
        while await asyncio.wait_for(loop.sock_recv(raw, 4096), 10):  # the channel closes the connection
            pass
    finally:
        raw.close()
    assert got == []


def test_a_data_frame_before_ready_fails_the_workers_handshake(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)

    def supervisor() -> None:
        conn, _ = listener.accept()
        conn.sendall(zmtp.GREETING + EARLY_FRAME + zmtp.ready(b"ROUTER") + LATE_FRAME)
        conn.recv(4096)

    threading.Thread(target=supervisor, daemon=True).start()
    try:
        with pytest.raises(LinkClosed, match="message before the handshake"):
            DealerSocket("ipc://%s" % (tmp_path / "s"), b"w", connect_timeout_s=10)
    finally:
        listener.close()


def test_a_large_frame_header_alone_does_not_allocate_the_frame():
    """The reader allocated the declared size of a split large frame up front: a 9-byte header made either
    end allocate up to its 1 GiB bound (the fuzz run ran out of memory); memory now follows the bytes."""
    reader = zmtp.Reader(zmtp.check_greeting, lambda flags, body: None, 1 << 30)
    tracemalloc.start()
    try:
        reader.feed(zmtp.GREETING + zmtp.frame_header(0, 64 << 20) + b"x" * 70_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    got: list[int] = []
    reader = zmtp.Reader(zmtp.check_greeting, lambda flags, body: got.append(len(body)), 1 << 30)
    stream = zmtp.GREETING + zmtp.frame_header(0, 3 << 20) + bytes(3 << 20)
    for i in range(0, len(stream), 65536):
        reader.feed(stream[i:i + 65536])
    assert got == [3 << 20] and reader.idle()
