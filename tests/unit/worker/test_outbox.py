"""worker/channel.py Outbox: messages posted from model threads reach the main thread's socket in post
order, none is left behind, and a burst posted before the main thread flushes costs one wake-up byte."""

from __future__ import annotations

import os
import select
import threading
from typing import Any

from inferd.worker.channel import Outbox


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
