"""Messages for a worker's main socket from any thread (responses of decoupled requests).

The posting thread sends one itself when nothing waits before it, the socket is free and the previous post was a
while ago (a response that would wait for the main thread's wake-up: one hop less); otherwise (a burst of tokens)
it is queued and the main thread, woken through a pipe it polls beside the socket, sends the queue in order. A
thread may also hold its posts and release them in one write (a model's event loop: every stream's token of an
engine step).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

from .channel import Channel
from .wire.messages import ProtocolError, encode_header

# A post this soon after the previous one is queued even when it could go at once: in a burst (a model
# streaming tokens at no cost, many streams at once) the main thread's flush sends the queue with one wake-up,
# which costs less CPU per response than a send from each posting thread; a lone response goes at once.
DIRECT_GAP_NS = 200_000
_monotonic_ns = time.monotonic_ns


class Outbox:
    """Messages for the main socket from any thread. `post` encodes the message and, with a `direct`
    channel, sends it from the posting thread when the queue is empty, no other thread is writing and the
    previous post is `direct_gap_ns` old or more; otherwise it queues it and writes a wake-up byte to a
    pipe; the main thread polls `fileno()` beside its socket and calls `flush(channel)`. Order is kept per
    posting thread (one FIFO: a message is sent directly only when nothing is queued before it, and the
    flush holds the channel's send lock from taking the queue to its last send). The pipe lives as long as
    the process (a thread may still post while the worker exits); `stop_direct()` sends everything through
    the main thread from then on."""

    def __init__(self, direct: Optional[Channel] = None, direct_gap_ns: int = DIRECT_GAP_NS) -> None:
        self._queue: collections.deque[tuple[bytes, Sequence[Any]]] = collections.deque()
        self._lock = threading.Lock()  # keeps encode+append atomic so the FIFO order is the post order
        self._direct = direct
        self._direct_gap_ns = direct_gap_ns
        self._last_post_ns = 0
        self._local = threading.local()  # .held: this thread's posts held by `hold` (None: not held)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def post(self, message: Any, frames: Sequence[Any] = ()) -> None:
        self.post_encoded(encode_header(message), frames)

    def stop_direct(self) -> None:
        """Posting threads queue from now on (the main thread's last flush and goodbye come after)."""
        with self._lock:
            self._direct = None

    def hold(self) -> None:
        """This thread's posts wait for `release`, which sends them in one write (a model's event loop holds what
        one pass emits: every stream's token of an engine step)."""
        if getattr(self._local, "held", None) is None:
            self._local.held = []

    def release(self) -> None:
        """Send what this thread posted since `hold`: in one write from this thread when nothing is queued and
        the socket is free, else queued for the main thread's flush (one wake-up)."""
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held:
            self._send_or_queue(held, True)

    def post_encoded(self, header: bytes, frames: Sequence[Any] = ()) -> None:
        """`post` for a header already encoded."""
        held = getattr(self._local, "held", None)
        if held is not None:
            held.append((header, frames))
            return
        self._send_or_queue([(header, frames)], False)

    def _send_or_queue(self, messages: list[tuple[bytes, Sequence[Any]]], burst: bool) -> None:
        """Send `messages` from this thread in one write when nothing is queued before them, the socket is free
        and (unless they are a `burst` already) the previous post is `direct_gap_ns` old; else queue them."""
        now = _monotonic_ns()
        with self._lock:
            queue = self._queue
            direct = self._direct
            spaced = burst or now - self._last_post_ns >= self._direct_gap_ns
            self._last_post_ns = now
            if not queue and direct is not None and spaced:
                try:
                    if direct.try_send_many(messages):
                        return
                except ProtocolError:
                    pass  # the link is gone: queued, the main thread meets the same error and ends the worker
            wake = not queue
            queue.extend(messages)
        if not wake:
            # the main thread has not taken what is queued yet: the byte written for the first of it wakes it
            # for these too (a model sending tokens faster than they are sent saves a syscall per token)
            return
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending anyway
        except OSError:
            pass

    def flush(self, channel: Channel) -> None:
        """Main thread: send everything queued, oldest first."""
        try:
            while os.read(self._read_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        # the send lock first: no posting thread sends directly (ahead of what is taken) until the last of
        # it is sent
        lock = getattr(channel, "send_lock", None)
        if lock is None:
            self._flush(channel)
            return
        with lock:
            self._flush(channel)

    def _flush(self, channel: Channel) -> None:
        # taken under the lock, after the pipe is drained: a message posted from now on finds the queue
        # empty and writes a wake-up byte of its own (post_encoded's check and append are one step)
        with self._lock:
            if not self._queue:
                return
            taken, self._queue = self._queue, collections.deque()
        try:
            while taken:
                header, frames = taken[0]
                channel.send_encoded(header, frames)
                taken.popleft()
        finally:
            if taken:  # a send failed: what was not sent goes back in front, in order
                with self._lock:
                    taken.extend(self._queue)
                    self._queue = taken
