"""worker/channel.py Outbox: messages posted from model threads reach the main thread's socket in post
order, none is left behind, and a burst posted before the main thread flushes costs one wake-up byte. With
a real channel (Outbox(direct=channel)) a posting thread sends its message itself while nothing is queued
before it and no other thread writes; the rest still goes through the main thread, in order."""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Any

import pytest
import zmq
from inferd.worker.channel import Channel
from inferd.worker.outbox import Outbox
from inferd.worker.wire import zmtp
from inferd.worker.zmtp_socket import DealerSocket


class Sent:
    """What the main thread sends on its socket (Channel.send_encoded), recorded."""

    def __init__(self) -> None:
        self.headers: list[bytes] = []

    def send_encoded(self, header: bytes, frames: Any = ()) -> None:
        self.headers.append(header)


def _pipe_bytes(outbox: Outbox) -> int:
    n = 0
    try:
        while True:
            got = os.read(outbox.fileno(), 4096)
            if not got:
                return n
            n += len(got)
    except BlockingIOError:
        return n


def test_a_burst_before_the_flush_writes_one_wake_up_byte() -> None:
    """Before: one byte (one write syscall, one wake-up) per message."""
    outbox = Outbox()
    for i in range(100):
        outbox.post_encoded(b"%d" % i)
    assert _pipe_bytes(outbox) == 1
    sent = Sent()
    outbox.flush(sent)  # type: ignore[arg-type]
    assert sent.headers == [b"%d" % i for i in range(100)]
    outbox.post_encoded(b"next")  # the queue is empty again: this one wakes the main thread itself
    assert _pipe_bytes(outbox) == 1


def test_concurrent_posters_lose_nothing_and_keep_their_order() -> None:
    """Four threads post while the main thread polls the pipe and flushes, as the runtime does: every
    message arrives, each thread's in its order, and none waits without a wake-up byte pending."""
    outbox = Outbox()
    sent = Sent()
    threads_n, each = 4, 3000
    start = threading.Barrier(threads_n + 1)

    def poster(t: int) -> None:
        start.wait()
        for i in range(each):
            outbox.post_encoded(b"%d:%d" % (t, i))

    threads = [threading.Thread(target=poster, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    start.wait()
    while len(sent.headers) < threads_n * each:
        ready, _, _ = select.select([outbox.fileno()], [], [], 10.0)
        assert ready, f"stranded: {threads_n * each - len(sent.headers)} messages queued without a wake-up"
        outbox.flush(sent)  # type: ignore[arg-type]
    for th in threads:
        th.join()
    seen: dict[int, int] = {}
    for header in sent.headers:
        t, i = (int(x) for x in header.split(b":"))
        assert i == seen.get(t, -1) + 1, f"thread {t}: message {i} after {seen.get(t)}"
        seen[t] = i
    assert seen == {t: each - 1 for t in range(threads_n)}


# ---- posting threads that send themselves (Outbox(direct=channel)) ---------------------------------------
# (direct_gap_ns=0: every post may go directly; the default gap is tested last)


@pytest.fixture
def linked(tmp_path: Any) -> Any:
    """A real worker Channel connected to a pyzmq ROUTER (the supervisor's side), and that ROUTER."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/s.sock"
    router.bind(endpoint)
    channel = Channel(endpoint, "w")
    try:
        yield channel, router
    finally:
        channel.close()
        router.close()
        ctx.term()


def test_posting_threads_send_themselves_in_order_and_the_main_thread_sends_the_rest(linked) -> None:
    """Four threads post while a main thread polls the pipe and flushes: every message reaches the other end
    once, each thread's in its order, and most of them without a wake-up of the main thread."""
    channel, router = linked
    outbox = Outbox(channel, direct_gap_ns=0)
    threads_n, each = 4, 2000
    start = threading.Barrier(threads_n + 1)
    done = threading.Event()
    woken = [0]

    def poster(t: int) -> None:
        start.wait()
        for i in range(each):
            outbox.post_encoded(b"%d:%d" % (t, i))

    def main_thread() -> None:  # as message_loop's _recv_streaming: poll the pipe, flush
        while not done.is_set():
            if select.select([outbox.fileno()], [], [], 0.05)[0]:
                woken[0] += 1
                outbox.flush(channel)

    threads = [threading.Thread(target=poster, args=(t,)) for t in range(threads_n)]
    flusher = threading.Thread(target=main_thread)
    flusher.start()
    for th in threads:
        th.start()
    start.wait()
    seen: dict[int, int] = {}
    try:
        for _ in range(threads_n * each):
            assert router.poll(10_000), f"stranded: {threads_n * each - sum(v + 1 for v in seen.values())} lost"
            identity, header = router.recv_multipart()
            t, i = (int(x) for x in header.split(b":"))
            assert i == seen.get(t, -1) + 1, f"thread {t}: message {i} after {seen.get(t)}"
            seen[t] = i
    finally:
        done.set()
        flusher.join()
        for th in threads:
            th.join()
    assert seen == {t: each - 1 for t in range(threads_n)}
    assert woken[0] < threads_n * each // 2


def test_a_post_waits_behind_the_queue_and_after_stop_direct(linked) -> None:
    channel, router = linked
    outbox = Outbox(channel, direct_gap_ns=0)
    outbox.post_encoded(b"direct")
    assert router.recv_multipart() == [b"w", b"direct"] and _pipe_bytes(outbox) == 0
    held, release = threading.Event(), threading.Event()

    def main_thread_writing() -> None:
        with channel.send_lock:
            held.set()
            release.wait(10)

    writer = threading.Thread(target=main_thread_writing)
    writer.start()
    held.wait(10)
    outbox.post_encoded(b"q1")  # the main thread is writing: queued (and it is woken once)
    release.set()
    writer.join()
    outbox.post_encoded(b"q2")  # something is queued before it: it queues too
    assert _pipe_bytes(outbox) == 1
    outbox.flush(channel)
    assert [router.recv_multipart()[1] for _ in range(2)] == [b"q1", b"q2"]
    outbox.stop_direct()
    outbox.post_encoded(b"last")
    assert _pipe_bytes(outbox) == 1 and not router.poll(50)
    outbox.flush(channel)
    assert router.recv_multipart()[1] == b"last"


def test_try_send_sends_nothing_into_a_full_buffer() -> None:
    """DealerSocket.try_send_many: False, nothing written, while the peer reads nothing; True again once
    it has read (the stream stays whole: the peer then reads whole frames)."""
    a, b = socket.socketpair()
    sock = DealerSocket.__new__(DealerSocket)  # (no handshake: only the sending half is used)
    sock._sock = a
    sock._held, sock._held_bytes = [], 0
    try:
        sent = 0
        while sock.try_send_many([[b"x" * 1000]]):
            sent += 1
            assert sent < 100_000, "the buffer never filled"
        b.setblocking(False)
        got = b""
        try:
            while True:
                got += b.recv(1 << 20)
        except BlockingIOError:
            pass
        assert got == zmtp.encode([b"x" * 1000])[0] * sent
        assert sock.try_send_many([[b"y"]])
        assert sock.try_send_many([[b"z" * (1 << 17)]]) is False  # a large frame: sent by send_multipart
    finally:
        a.close()
        b.close()


def test_a_post_soon_after_the_previous_one_is_queued(linked) -> None:
    """A burst (posts within direct_gap_ns of each other) goes through the main thread's flush; a post after
    a pause goes at once."""
    channel, router = linked
    outbox = Outbox(channel, direct_gap_ns=10**9)  # (a second: no post of this test is spaced by chance)
    outbox._last_post_ns = 0  # the first post follows a long pause
    outbox.post_encoded(b"first")
    assert router.recv_multipart()[1] == b"first" and _pipe_bytes(outbox) == 0
    outbox.post_encoded(b"burst 1")
    outbox.post_encoded(b"burst 2")
    assert _pipe_bytes(outbox) == 1 and not router.poll(50)
    outbox.flush(channel)
    assert [router.recv_multipart()[1] for _ in range(2)] == [b"burst 1", b"burst 2"]
    outbox._last_post_ns -= 10**9  # a pause
    outbox.post_encoded(b"after a pause")
    assert router.recv_multipart()[1] == b"after a pause" and _pipe_bytes(outbox) == 0


# ---- posts held by a thread until it releases them (Outbox.hold / release) -----------------------------------


def test_held_posts_leave_together_on_release_and_other_threads_are_not_held(linked) -> None:
    channel, router = linked
    outbox = Outbox(direct=channel, direct_gap_ns=0)
    outbox.hold()
    for i in range(20):
        outbox.post_encoded(b"held %d" % i)
    other = threading.Thread(target=outbox.post_encoded, args=(b"other thread",))
    other.start()
    other.join()
    assert router.poll(10_000)
    assert router.recv_multipart() == [b"w", b"other thread"]  # (its posts were never held)
    assert not router.poll(100)  # the held ones wait for release
    outbox.release()
    assert _pipe_bytes(outbox) == 0  # sent by this thread: the main thread is not woken
    for i in range(20):
        assert router.poll(10_000)
        assert router.recv_multipart() == [b"w", b"held %d" % i]
    outbox.post_encoded(b"after")  # released: posts go as before
    assert router.poll(10_000) and router.recv_multipart() == [b"w", b"after"]
    outbox.release()  # (nothing held: nothing happens)
    assert not router.poll(100)


def test_held_posts_go_through_the_main_thread_when_the_socket_is_busy(linked) -> None:
    """Released while another thread writes: queued in order behind what was queued, with one wake-up byte."""
    channel, router = linked
    outbox = Outbox(direct=channel, direct_gap_ns=0)

    def post_and_release() -> None:
        outbox.hold()
        for i in range(5):
            outbox.post_encoded(b"held %d" % i)
        outbox.release()

    with channel.send_lock:  # (taken by this thread: the posting thread cannot send itself)
        poster = threading.Thread(target=post_and_release)
        poster.start()
        poster.join(10)
        assert not poster.is_alive()
    assert _pipe_bytes(outbox) == 1
    assert not router.poll(100)
    outbox.flush(channel)
    assert [router.recv_multipart() for _ in range(5)] == [[b"w", b"held %d" % i] for i in range(5)]
