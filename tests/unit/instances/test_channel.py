"""The ROUTER channel: routing by identity, heartbeat identities, bursts, unreachable peers."""

from __future__ import annotations

import asyncio
import os
import stat
import time

import pytest
import zmq
from inferd.supervisor.instances.channel import Channel
from inferd.worker.wire.errors import ErrorCode, InferdError

from .zmq_peers import dealer, recv


async def test_routes_by_identity_and_heartbeat(channel):
    got: dict[str, list] = {"a": [], "a/hb": [], "b": []}
    done = asyncio.Event()

    def handler(key):
        def h(frames):
            got[key].append([bytes(f) for f in frames])
            if sum(map(len, got.values())) == 4:
                done.set()
        return h

    channel.register("a", handler("a"), handler("a/hb"))
    channel.register("b", handler("b"), handler("b/hb"))
    ctx = zmq.Context()
    try:
        a, ahb, b, stray = (dealer(ctx, channel.endpoint, i) for i in ("a", "a/hb", "b", "stray"))
        a.send_multipart([b"h", b"data"])
        ahb.send(b"beat")
        b.send(b"x")
        stray.send(b"nobody")
        b.send(b"y")
        await asyncio.wait_for(done.wait(), 5)
        assert got == {"a": [[b"h", b"data"]], "a/hb": [[b"beat"]], "b": [[b"x"], [b"y"]]}
        channel.send("a", [b"reply", memoryview(b"zero-copy")])
        assert await recv(a) == [b"reply", b"zero-copy"]
        assert channel.send_heartbeat("a", [b"hb"])
        assert await recv(ahb) == [b"hb"]
        assert channel.dropped >= 1
    finally:
        ctx.destroy(linger=0)


async def test_burst_larger_than_one_drain(channel):
    n = 3000
    count = 0
    done = asyncio.Event()

    def h(frames):
        nonlocal count
        count += 1
        if count == n:
            done.set()

    channel.register("w", h, h)
    ctx = zmq.Context()
    try:
        s = dealer(ctx, channel.endpoint, "w")
        for i in range(n):
            while True:  # never block the loop that drains the other end
                try:
                    s.send(b"%d" % i, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    await asyncio.sleep(0.001)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        ctx.destroy(linger=0)


async def test_send_to_unknown_peer_is_unavailable(channel):
    with pytest.raises(InferdError) as info:
        channel.send("nobody", [b"x"])
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert channel.send_heartbeat("nobody", [b"x"]) is False


async def test_socket_is_private_and_removed(run_dir):
    ch = Channel(run_dir)
    ch.open()
    assert stat.S_IMODE(os.stat(ch.path).st_mode) & 0o077 == 0
    ch.close()
    assert not os.path.exists(ch.path)
    with pytest.raises(InferdError):
        ch.send("a", [b"x"])


def test_long_run_dir_refused():
    with pytest.raises(ValueError, match="too long"):
        Channel("/tmp/" + "x" * 120)


async def test_held_messages_are_written_together_at_the_end_of_the_pass(channel, monkeypatch):
    """A message is written at once unless held; a held one waits for the end of the loop pass and takes
    every later message of the pass with it, in the order sent; held bytes count against the unsent limit."""
    from inferd.supervisor.instances import channel as channel_module

    hello = asyncio.Event()
    channel.register("w", lambda frames: hello.set(), lambda frames: None)
    ctx = zmq.Context()
    try:
        w = dealer(ctx, channel.endpoint, "w")
        w.send(b"hi")  # the channel knows the peer once its message is routed
        await asyncio.wait_for(hello.wait(), 10)
        big = bytes(range(256)) * 400  # 100 KiB: written from where it lies (pieces)
        channel.send("w", [b"first"])
        assert w.poll(10_000)  # written before this pass ends: the loop has not run since
        assert w.recv_multipart() == [b"first"]
        channel.send("w", [b"second", b"x"])
        assert w.poll(10_000)
        channel.send("w", [b"third", memoryview(big)], hold=True)
        channel.send("w", [b"fourth"])  # after a held one: held too (order)
        time.sleep(0.05)  # the loop does not run: a write made now would reach the dealer meanwhile
        assert w.recv_multipart() == [b"second", b"x"] and not w.poll(0)
        assert [await recv(w), await recv(w)] == [[b"third", big], [b"fourth"]]

        monkeypatch.setattr(channel_module, "_MAX_UNSENT", 1000)
        channel.send("w", [bytes(600)], hold=True)
        channel.send("w", [bytes(300)])  # 600 held: under the limit
        channel.send("w", [bytes(200)])  # 900 held: under the limit
        with pytest.raises(InferdError) as info:
            channel.send("w", [b"x"])  # 1100 held: refused
        assert info.value.code == ErrorCode.UNAVAILABLE and "not reading" in info.value.message
        assert [len((await recv(w))[0]) for _ in range(3)] == [600, 300, 200]
    finally:
        ctx.destroy(linger=0)
