"""A worker's own ZeroMQ DEALER: ZMTP spoken by the owning thread on a blocking Unix socket.

libzmq hands every message through its I/O thread: a message from the supervisor wakes that thread,
which then wakes the receiving thread, and a reply crosses the same two hops back; in the batching
benchmark those hand-offs were a large share of every batch cycle (bench/RESULTS.md).
Here the thread that owns the socket reads and writes it itself, so the supervisor's write wakes it
directly and its reply is one `sendmsg`. Used for the main socket (main thread) and for the
per-thread sockets of synchronous BLS calls, and the heartbeat thread's socket (an idle worker wakes
only when pinged, with no I/O thread woken beside it); one thread per socket. The BLS thread's socket
stays libzmq's.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any, Optional

from .wire import zmtp
from .wire.messages import ProtocolError

MAX_FRAME = 1 << 30  # as the supervisor's bound: tensors larger than this travel in shared memory
_READ_SIZE = 64 * 1024  # below malloc's mmap threshold: a read allocates no fresh pages
_COPY_MAX = 16 * 1024  # a read this short is copied out of the read buffer, which is then reused
_HOLD_MAX = 64 * 1024  # the most bytes of messages held for one write
_MAX_IOV = 512  # pieces per sendmsg call (Linux allows 1024)
_PEERS = frozenset((b"ROUTER", b"DEALER"))  # socket types a DEALER talks to
_MORE, _LONG, _COMMAND = zmtp.MORE, zmtp.LONG, zmtp.COMMAND
_unpack_size = zmtp.LONG_SIZE.unpack_from
_DONTWAIT = socket.MSG_DONTWAIT
MAX_POLL_US = 1_000_000  # the most an Execute may ask the worker to poll for its next message


class LinkClosed(ProtocolError):
    """The supervisor closed the connection, or broke ZMTP (for the main socket, a protocol error: the
    worker exits and is restarted)."""


class DealerSocket:
    def __init__(self, endpoint: str, identity: bytes, max_frame: int = MAX_FRAME,
                 connect_timeout_s: float = 10.0) -> None:
        if not endpoint.startswith("ipc://"):
            raise ValueError("the worker link is an ipc:// endpoint, not %r" % endpoint)
        self._sock = _connect(endpoint[len("ipc://"):], connect_timeout_s)
        self._messages: collections.deque[list[memoryview]] = collections.deque()
        self._peer_ready = False
        self._spare: Optional[bytearray] = None  # the read buffer (reused while reads are short)
        self._max_frame = max_frame
        self._assembler = zmtp.Messages(self._on_command, self._on_message)
        self._reader = zmtp.Reader(zmtp.check_greeting, self._assembler.on_frame, max_frame)
        self._steady = False  # no partial frame or message held by the reader: see recv_one
        self._poll_until = 0.0  # recv_one polls (instead of sleeping in poll()) until then: poll_next
        self._poller = select.poll()  # POLLIN (POLLHUP and POLLERR end a wait too): poll() and recv_one
        self._poller.register(self._sock.fileno(), select.POLLIN)
        self._wait_readable = self._poller.poll
        self._held: list[bytes] = []  # small messages held for one write (send_multipart's `hold`)
        self._held_bytes = 0
        self._sock.sendall(zmtp.GREETING + zmtp.ready(b"DEALER", identity))
        self._sock.settimeout(connect_timeout_s)  # the handshake has a deadline, then reads block
        try:
            while not self._peer_ready:
                self._read(True)
        except LinkClosed as exc:
            self._sock.close()
            raise LinkClosed("no ZMTP handshake from %s: %s" % (endpoint, exc)) from None
        self._sock.settimeout(None)

    def fileno(self) -> int:
        return self._sock.fileno()

    def set_send_timeout(self, seconds: float) -> None:
        """A send that cannot write for `seconds` fails (LinkClosed) instead of waiting on: for a socket whose
        peer may stop reading without the worker having to wait for it (a direct peer: direct_peers.py).
        SO_SNDTIMEO, so reads stay as they are."""
        whole = int(seconds)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                              struct.pack("ll", whole, int((seconds - whole) * 1e6)))

    def buffered(self) -> bool:
        """A whole message is waiting in this object (read with an earlier one): no poll() would say so."""
        return bool(self._messages)

    def poll(self, timeout_ms: int = -1) -> bool:
        """True when a whole message is waiting or the socket turned readable within `timeout_ms`
        (-1: no limit); a readable socket may hold only part of a message (recv_multipart(False) tells)."""
        if self._messages:
            return True
        return bool(self._poller.poll(timeout_ms))

    def recv_multipart(self, block: bool = True) -> Optional[list[memoryview]]:
        """The next message's frames (views that stay valid), or None if `block` is False and no whole
        message is waiting. Raises LinkClosed."""
        messages = self._messages
        while not messages:
            if not self._read(block):
                return None
        return messages.popleft()

    def recv_one(self) -> list[memoryview]:
        """`recv_multipart()` (blocking) for the main loop: a read that holds whole messages of data frames,
        the usual case, is split here in one pass; anything else (a message or frame cut by the read's
        end, ZMTP commands) goes through the frame reader."""
        messages = self._messages
        if messages:
            return messages.popleft()
        if self._steady:
            buf = self._spare
            if buf is None:
                buf = self._spare = bytearray(_READ_SIZE)
            try:
                # Wait in poll() for incoming data, then read. A thread blocked in recv() on a Unix socket is
                # also woken each time the peer reads what this socket sent (the freed send-buffer space
                # wakes every sleeper on the socket): in lock step, once per request, a wake-up and a
                # sleep for nothing. poll()'s wait is keyed to POLLIN and ignores those.
                while True:
                    if self._poll_until:
                        n = self._polled(buf)
                        if n >= 0:
                            break
                    self._wait_readable()
                    try:
                        n = self._sock.recv_into(buf, 0, _DONTWAIT)
                        break
                    except BlockingIOError:
                        continue
            except OSError as exc:
                raise LinkClosed("reading from the supervisor failed: %s" % (exc or type(exc).__name__)) from None
            if n and n <= _COPY_MAX:
                view = memoryview(buf[:n])  # bytearray slice: a copy of its own (see _read)
                got = _whole_messages(view, n, self._max_frame)
                if got is not None:
                    if len(got) > 1:  # Executes sent ahead (the supervisor keeps a few in flight)
                        messages.extend(got[1:])
                    return got[0]
                self._feed(view)
            elif n:
                view, self._spare = memoryview(buf)[:n], None
                self._feed(view)
            else:
                raise LinkClosed("the supervisor closed the connection")
        while not messages:
            self._read(True)
        return messages.popleft()

    def recv_ready(self) -> Optional[list[memoryview]]:
        """`recv_multipart(False)` with recv_one's one-pass split of a read that holds whole messages (a
        decoupled model's main thread reads this way after each wake-up); None when nothing whole waits."""
        messages = self._messages
        if messages:
            return messages.popleft()
        if not self._steady:
            return self.recv_multipart(False)
        buf = self._spare
        if buf is None:
            buf = self._spare = bytearray(_READ_SIZE)
        try:
            n = self._sock.recv_into(buf, 0, _DONTWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise LinkClosed("reading from the supervisor failed: %s" % (exc or type(exc).__name__)) from None
        if not n:
            raise LinkClosed("the supervisor closed the connection")
        if n <= _COPY_MAX:
            view = memoryview(buf[:n])  # bytearray slice: a copy of its own (see _read)
            got = _whole_messages(view, n, self._max_frame)
            if got is not None:
                if len(got) > 1:
                    messages.extend(got[1:])
                return got[0]
            self._feed(view)
        else:
            view, self._spare = memoryview(buf)[:n], None
            self._feed(view)
        return messages.popleft() if messages else self.recv_multipart(False)  # (the rest may be waiting)

    def poll_next(self, us: int) -> None:
        """The next `recv_one` tries to read for up to `us` µs, yielding the CPU between tries, before it
        sleeps (the supervisor asked: it polls too, and the next request is expected within that time)."""
        self._poll_until = time.monotonic() + min(us, MAX_POLL_US) / 1e6

    def _polled(self, buf: bytearray) -> int:
        """Read into `buf` as soon as there is something, until `_poll_until` (then -1; the poll is over)."""
        until, self._poll_until = self._poll_until, 0.0
        recv_into, now, give_way = self._sock.recv_into, time.monotonic, os.sched_yield
        while True:
            try:
                return recv_into(buf, 0, _DONTWAIT)
            except BlockingIOError:
                if now() >= until:
                    return -1
                give_way()  # a runnable process on this CPU goes first

    def send_multipart(self, frames: Sequence[Any], hold: bool = False) -> None:
        """Blocks until the whole message is in the kernel's buffer. Raises LinkClosed. `hold`: a small
        message may wait in this object for `flush` (or the next send without `hold`)."""
        whole, pieces = zmtp.encode(frames)
        if hold and not pieces and self._held_bytes + len(whole) <= _HOLD_MAX:
            self._held.append(whole)
            self._held_bytes += len(whole)
            return
        if self._held:
            self.flush()
        try:
            if not pieces:
                self._sock.sendall(whole)
            else:
                self._send_pieces(pieces)
        except OSError as exc:
            raise LinkClosed("sending to the supervisor failed: %s" % exc) from None

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def flush(self) -> None:
        """Write the messages held by `send_multipart(hold=True)`, in one write. Raises LinkClosed."""
        held = self._held
        if not held:
            return
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        self._held_bytes = 0
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise LinkClosed("sending to the supervisor failed: %s" % exc) from None

    def try_send_many(self, messages: Sequence[Sequence[Any]]) -> bool:
        """`send_multipart` of these messages, in one write, when it can start at once: False (nothing sent) when
        the kernel's buffer is full, one holds a large frame (those go by `send_multipart`) or messages are held
        (they go first: the owning thread's next send or flush). A write cut short by a buffer that filled
        meanwhile is finished blocking (the rest of a message must follow it). Raises LinkClosed."""
        if self._held:
            return False
        wholes = []
        for frames in messages:
            whole, pieces = zmtp.encode(frames)
            if pieces:
                return False
            wholes.append(whole)
        data = wholes[0] if len(wholes) == 1 else b"".join(wholes)
        sock = self._sock
        try:
            try:
                sent = sock.send(data, _DONTWAIT)
            except BlockingIOError:
                return False
            if sent < len(data):
                sock.sendall(memoryview(data)[sent:])
        except OSError as exc:
            raise LinkClosed("sending to the supervisor failed: %s" % exc) from None
        return True

    def close(self) -> None:
        self._sock.close()

    def _send_pieces(self, pieces: list[Any]) -> None:
        views = [memoryview(p).cast("B") for p in pieces]
        while views:
            sent = self._sock.sendmsg(views[:_MAX_IOV])
            while sent:  # drop what went out; a partial write leaves the rest of one piece
                head = views[0]
                if sent >= len(head):
                    sent -= len(head)
                    views.pop(0)
                else:
                    views[0] = head[sent:]
                    sent = 0

    def _read(self, block: bool) -> bool:
        """Feed one read to the frame reader; False when nothing was waiting (block False). The frames
        of each read lie in a buffer of their own (models may change their inputs in place): a short
        read is copied out of the reused read buffer (cheaper than a fresh zeroed 64 KiB one), a long
        one keeps the read buffer, and the next read gets a new one."""
        buf = self._spare
        if buf is None:
            buf = self._spare = bytearray(_READ_SIZE)
        try:
            n = self._sock.recv_into(buf) if block else self._sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False  # a model polling for cancellation allocates nothing per poll
        except OSError as exc:  # a timeout during the handshake too (socket.timeout is one on 3.9)
            raise LinkClosed("reading from the supervisor failed: %s" % (exc or type(exc).__name__)) from None
        if not n:
            raise LinkClosed("the supervisor closed the connection")
        if n <= _COPY_MAX:
            data = memoryview(buf[:n])  # bytearray slice: a copy of its own
        else:
            data, self._spare = memoryview(buf)[:n], None
        self._feed(data)
        return True

    def _feed(self, data: memoryview) -> None:
        try:
            self._reader.feed(data)
        except zmtp.ProtocolViolation as exc:
            raise LinkClosed("the supervisor broke ZMTP: %s" % exc) from None
        # recv_one splits a read itself only while nothing is left over from earlier ones
        self._steady = self._peer_ready and self._reader.idle() and self._assembler.idle()

    def _on_message(self, parts: list[memoryview]) -> None:
        if not self._peer_ready:
            raise zmtp.ProtocolViolation("message before the handshake")
        self._messages.append(parts)

    def _on_command(self, body: memoryview) -> None:
        name, rest = zmtp.parse_command(body)
        if name == b"READY":
            if self._peer_ready:
                raise zmtp.ProtocolViolation("a second READY")
            peer = zmtp.parse_properties(rest).get(b"socket-type")
            if peer not in _PEERS:
                raise zmtp.ProtocolViolation("a DEALER cannot talk to a %r socket" % peer)
            self._peer_ready = self._assembler.handshaken = True
        elif name == b"PING":  # ZMTP heartbeat: answer with the ping's context
            self._sock.sendall(zmtp.command(b"PONG", bytes(rest[2:18])))
        elif name == b"ERROR":
            raise zmtp.ProtocolViolation("the peer reported an error: %r" % bytes(rest[1:]))


def _whole_messages(view: memoryview, end: int, max_frame: int) -> Optional[list[list[memoryview]]]:
    """The messages of `view` (each its frames) when it holds whole messages of data frames only, else None."""
    pos = 0
    parts: list[memoryview] = []
    messages = [parts]
    while end - pos >= 2:
        flags = view[pos]
        if flags & _LONG:
            if end - pos < 9:
                return None
            size = _unpack_size(view, pos + 1)[0]
            pos += 9
        else:
            size = view[pos + 1]
            pos += 2
        stop = pos + size
        if flags & _COMMAND or size > max_frame or stop > end:
            return None
        parts.append(view[pos:stop])
        pos = stop
        if not flags & _MORE:
            if pos == end:
                return messages
            parts = []
            messages.append(parts)
    return None


def _connect(path: str, timeout_s: float) -> socket.socket:
    """Connect like libzmq: retry while the endpoint is not there yet (or not listening)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise LinkClosed("cannot connect to %s: %s" % (path, exc)) from None
        time.sleep(delay)  # the supervisor binds before it starts workers: this is for odd set-ups
        delay = min(delay * 2, 0.1)
