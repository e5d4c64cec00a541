"""ZMTP 3 on the supervisor's side: framing split at every byte, limits, and interop with libzmq DEALERs
(handshake, heartbeats, large frames, handover, refused peers, a worker that stops reading)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import zmq
from inferd.supervisor.instances import channel as channel_mod
from inferd.worker.wire import zmtp
from inferd.worker.wire.errors import ErrorCode, InferdError

from .zmq_peers import dealer, recv


def wire(frames: list[bytes]) -> bytes:
    whole, pieces = zmtp.encode(frames)
    return whole or b"".join(bytes(p) for p in pieces)


def collect(max_frame: int = 1 << 30) -> tuple[zmtp.Reader, list, list]:
    greetings: list[bytes] = []
    got: list[tuple[int, bytes]] = []
    reader = zmtp.Reader(greetings.append, lambda flags, body: got.append((flags, bytes(body))), max_frame)
    return reader, greetings, got


STREAM_FRAMES = [b"", b"a", b"x" * 255, b"y" * 256, b"z" * 70_000, b"tail"]


def test_reader_reassembles_frames_split_at_every_byte():
    stream = zmtp.GREETING + wire(STREAM_FRAMES[:3]) + wire(STREAM_FRAMES[3:])
    expected = [(zmtp.MORE, STREAM_FRAMES[0]), (zmtp.MORE, STREAM_FRAMES[1]), (0, STREAM_FRAMES[2]),
                (zmtp.MORE | zmtp.LONG, STREAM_FRAMES[3]), (zmtp.MORE | zmtp.LONG, STREAM_FRAMES[4]),
                (0, STREAM_FRAMES[5])]
    for cut in list(range(0, 80)) + list(range(len(stream) - 300, len(stream), 7)) + [40_000]:
        reader, greetings, got = collect()
        reader.feed(stream[:cut])
        reader.feed(stream[cut:])
        assert greetings == [zmtp.GREETING]
        assert got == expected, cut


def test_reader_byte_by_byte():
    stream = zmtp.GREETING + wire([b"h", b"q" * 300])
    reader, greetings, got = collect()
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1])
    assert got == [(zmtp.MORE, b"h"), (zmtp.LONG, b"q" * 300)]


def test_oversized_frame_is_a_violation_before_any_allocation():
    reader, _, _ = collect(max_frame=1000)
    with pytest.raises(zmtp.ProtocolViolation, match="exceeds"):
        reader.feed(zmtp.GREETING + zmtp.frame_header(0, 1 << 40))


@pytest.mark.parametrize("greeting, reason", [
    (b"GET / HTTP/1.1\r\n" + bytes(48), "not a ZMTP 3"),
    (zmtp.GREETING[:10] + b"\x02\x00" + zmtp.GREETING[12:], "version 2.0"),
    (zmtp.GREETING[:12] + b"PLAIN".ljust(20, b"\x00") + zmtp.GREETING[32:], "NULL"),
])
def test_bad_greetings_are_refused(greeting, reason):
    with pytest.raises(zmtp.ProtocolViolation, match=reason):
        zmtp.check_greeting(greeting)


def test_ready_command_round_trip():
    reader, _, got = collect()
    reader.feed(zmtp.GREETING + zmtp.ready(b"ROUTER"))
    flags, body = got[0]
    assert flags & zmtp.COMMAND
    name, rest = zmtp.parse_command(memoryview(body))
    assert name == b"READY" and zmtp.parse_properties(rest) == {b"socket-type": b"ROUTER"}
    with pytest.raises(zmtp.ProtocolViolation):
        zmtp.parse_properties(memoryview(b"\x04Name\x00\x00\x00\x09short"))


async def test_large_frames_both_ways_and_heartbeats_answered(channel):
    inbox: asyncio.Queue[list[bytes]] = asyncio.Queue()
    channel.register("w", lambda frames: inbox.put_nowait([bytes(f) for f in frames]), lambda frames: None)
    ctx = zmq.Context()
    try:
        # libzmq drops a connection whose pings go unanswered for HEARTBEAT_TIMEOUT
        s = dealer(ctx, channel.endpoint, "w", HEARTBEAT_IVL=20, HEARTBEAT_TIMEOUT=200)
        monitor = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        big = bytes(range(256)) * 20_000  # 5 MB, many reads
        s.send_multipart([b"head", big, b""])
        assert await asyncio.wait_for(inbox.get(), 10) == [b"head", big, b""]
        await asyncio.sleep(0.6)  # many heartbeat intervals
        channel.send("w", [b"back", memoryview(big)])
        assert await recv(s) == [b"back", big]
        assert not monitor.poll(0), "libzmq dropped the connection: pings went unanswered"
    finally:
        ctx.destroy(linger=0)


async def test_newest_connection_takes_over_an_identity(channel):
    channel.register("w", lambda frames: None, lambda frames: None)
    ctx = zmq.Context()
    try:
        old = dealer(ctx, channel.endpoint, "w")
        old.send(b"hello")
        await asyncio.wait_for(_connected(channel, "w"), 10)
        first = channel._peers["w"]
        new = dealer(ctx, channel.endpoint, "w")
        new.send(b"hello")
        while channel._peers["w"] is first:
            await asyncio.sleep(0.005)
        channel.send("w", [b"to-new"])
        assert await recv(new) == [b"to-new"]
        assert not old.poll(100)
    finally:
        ctx.destroy(linger=0)


async def _connected(channel, identity: str) -> None:
    while identity not in channel._peers:
        await asyncio.sleep(0.005)


async def test_garbage_and_wrong_socket_types_are_dropped_and_others_keep_working(channel):
    inbox: asyncio.Queue[list[bytes]] = asyncio.Queue()
    channel.register("good", lambda frames: inbox.put_nowait([bytes(f) for f in frames]), lambda frames: None)
    loop = asyncio.get_running_loop()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.setblocking(False)
    await loop.sock_connect(raw, channel.path)
    await loop.sock_sendall(raw, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
    assert await asyncio.wait_for(_read_until_closed(loop, raw), 10)  # closed by the channel
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)  # a PUB may not talk to a ROUTER
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(channel.endpoint)
        good = dealer(ctx, channel.endpoint, "good")
        good.send(b"still here")
        assert await asyncio.wait_for(inbox.get(), 10) == [b"still here"]
    finally:
        ctx.destroy(linger=0)
        raw.close()


async def _read_until_closed(loop, sock: socket.socket) -> bool:
    while await loop.sock_recv(sock, 4096):
        pass
    return True


async def test_a_worker_that_stops_reading_gets_unavailable_not_unbounded_memory(channel, monkeypatch):
    monkeypatch.setattr(channel_mod, "_MAX_UNSENT", 1 << 20)
    channel.register("w", lambda frames: None, lambda frames: None)
    ctx = zmq.Context()
    try:
        s = dealer(ctx, channel.endpoint, "w", RCVHWM=1)
        s.send(b"hello")
        await asyncio.wait_for(_connected(channel, "w"), 10)
        chunk = b"x" * 65536
        with pytest.raises(InferdError) as info:
            for _ in range(100_000):
                channel.send("w", [chunk])
                await asyncio.sleep(0)
        assert info.value.code == ErrorCode.UNAVAILABLE and "not reading" in str(info.value)
    finally:
        ctx.destroy(linger=0)


async def test_a_worker_breaking_the_protocol_is_reported_and_dropped(channel, monkeypatch):
    monkeypatch.setattr(channel_mod, "_MAX_FRAME", 1000)
    broken: asyncio.Queue[str] = asyncio.Queue()
    channel.register("w", lambda frames: None, lambda frames: None, broken.put_nowait)
    ctx = zmq.Context()
    try:
        s = dealer(ctx, channel.endpoint, "w", RECONNECT_IVL=60_000)
        monitor = s.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        s.send(b"x" * 5000)
        assert "exceeds the 1000-byte limit" in await asyncio.wait_for(broken.get(), 10)
        assert await asyncio.wait_for(asyncio.to_thread(monitor.poll, 10_000), 15), "connection not dropped"
        channel.unregister("w")
        assert "w" not in channel._on_broken
    finally:
        ctx.destroy(linger=0)
