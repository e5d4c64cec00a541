"""The worker's ZeroMQ DEALER sockets to the supervisor's ROUTER.

- `Channel` (main thread): Hello, then request/reply messages, on a DealerSocket (zmtp_socket.py: ZMTP
  spoken by the main thread itself, no libzmq I/O thread in between). Messages read ahead of time
  (while a model polls for cancellation) are queued and handed out first by `recv()`.
- `Outbox` (outbox.py): messages produced on other threads, sent through a Channel.
- `HeartbeatThread`: its own DealerSocket (`identity + "/hb"`); answers each Heartbeat(seq) of the
  supervisor with the same seq, sleeps in between (the supervisor sets the pace), and calls `on_lost` when
  the supervisor has been silent for `timeout_s` (0 disables that check). With a `metrics` sender
  (metrics_sender.MetricsSender), it also sends what changed in the models' custom metrics after each
  answer (the runtime flushes it too, before each answer).
"""

from __future__ import annotations

import collections
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from .wire.messages import (
    Heartbeat,
    ProtocolError,
    decode,
    decode_header,
    encode,
    encode_header,
    json_loads,
)
from .zmtp_socket import DealerSocket

_orjson_loads: Optional[Callable[[bytes], Any]]
try:  # optional (a model environment needs only numpy and pyzmq): parses a header 2-3x faster
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_loads = None


# orjson turns integer literals beyond 64 bits (19 digits or more) into floats where json.loads keeps
# ints: a header holding such a digit run is left to json
_DIGIT_MAP = bytes(49 if 48 <= b <= 57 else 48 for b in range(256))
_LONG_DIGITS = b"1" * 19


def header_loads(raw: bytes) -> Any:
    """`json_loads(raw)`: with orjson where it accepts the text (the same values), else json's way."""
    if _orjson_loads is not None and raw[:1] == b"{" and _LONG_DIGITS not in raw.translate(_DIGIT_MAP):
        try:
            return _orjson_loads(raw)
        except Exception:  # noqa: S110 - NaN, lone surrogates, deep nesting...: json decides below
            pass
    return json_loads(raw)


class Channel:
    def __init__(self, endpoint: str, identity: str, connect_timeout_s: float = 10.0) -> None:
        # LinkClosed is a ProtocolError
        self._sock = DealerSocket(endpoint, identity.encode("utf-8"), connect_timeout_s=connect_timeout_s)
        self.identity = identity  # (a direct peer's socket is opened with the same: direct_peers.py)
        self._pending: collections.deque[tuple[Any, Sequence[Any]]] = collections.deque()
        self._error: Optional[ProtocolError] = None  # met while reading ahead; raised by recv()
        # one writer at a time: the main thread, or a thread sending its Outbox message itself (reads stay
        # the main thread's alone); reentrant: the Outbox's flush holds it around its sends
        self.send_lock = threading.RLock()

    def send(self, message: Any, frames: Sequence[Any] = ()) -> None:
        """Header then data frames, as one ZeroMQ multipart message."""
        self.send_encoded(encode_header(message), frames)

    def send_encoded(self, header: bytes, frames: Sequence[Any] = (), hold: bool = False) -> None:
        """`send` for a header already encoded (by `encode_header`). A message of small frames is joined
        into one write; one holding a frame of 64 KiB or more is written from where its frames lie.
        `hold`: a small message may wait for `flush` (DealerSocket.send_multipart)."""
        with self.send_lock:
            self._sock.send_multipart([header, *frames] if frames else (header,), hold)

    def flush(self) -> None:
        """Write what `send_encoded(hold=True)` held. Raises LinkClosed."""
        with self.send_lock:
            self._sock.flush()

    @property
    def holding(self) -> bool:
        return self._sock.holding

    def try_send_many(self, messages: Sequence[tuple[bytes, Sequence[Any]]]) -> bool:
        """Several (header, frames) in one write from any thread when they can go at once: False (nothing sent)
        when another thread is writing, the socket's buffer is full or one holds a large frame
        (DealerSocket.try_send_many). Raises LinkClosed."""
        lock = self.send_lock
        if not lock.acquire(blocking=False):
            return False
        try:
            return self._sock.try_send_many([[header, *frames] for header, frames in messages])
        finally:
            lock.release()

    def _recv(self, block: bool = True) -> Optional[tuple[Any, list[Any]]]:
        """One message: the header parsed, data frames as views of what was read (no copy)."""
        parts = self._sock.recv_multipart(block) if block else self._sock.recv_ready()
        if parts is None:
            return None
        return decode_header(bytes(parts[0]), header_loads), parts[1:]

    def poll_next(self, us: int) -> None:
        """`recv` polls for up to `us` µs before it sleeps (DealerSocket.poll_next)."""
        self._sock.poll_next(us)

    def recv(self) -> tuple[Any, Sequence[Any]]:
        """Next (message, data frames); blocks. Raises ProtocolError on a malformed message."""
        if self._pending:
            return self._pending.popleft()
        if self._error is not None:
            raise self._error
        parts = self._sock.recv_one()
        return decode_header(bytes(parts[0]), header_loads), parts[1:]

    def recv_nowait(self) -> Optional[tuple[Any, Sequence[Any]]]:
        """Next (message, data frames) if one is waiting, else None."""
        if self._pending:
            return self._pending.popleft()
        if self._error is not None:
            raise self._error
        return self._recv(False)

    def set_send_timeout(self, seconds: float) -> None:
        """Sends that cannot write for `seconds` fail (DealerSocket.set_send_timeout)."""
        self._sock.set_send_timeout(seconds)

    def buffered(self) -> bool:
        """Something for `recv_nowait` without reading the socket: a message read ahead or in the socket's
        buffer, or an error met while reading ahead (poll() would not wake for those)."""
        return bool(self._pending) or self._error is not None or self._sock.buffered()

    def fileno(self) -> int:
        """The main socket's descriptor, for polling after `recv_nowait` returned None (main thread only):
        a message already read in full is handed out by `recv_nowait`, never left to the poll."""
        return self._sock.fileno()

    def read_ahead(self) -> list[tuple[Any, Sequence[Any]]]:
        """Everything already waiting, without blocking; also queued for later `recv()` calls."""
        got: list[tuple[Any, Sequence[Any]]] = []
        while self._error is None:
            try:
                item = self._recv(False)
            except ProtocolError as exc:
                self._error = exc
                break
            if item is None:
                break
            got.append(item)
            self._pending.append(item)
        return got

    def unread(self, item: tuple[Any, Sequence[Any]]) -> None:
        """Put a message taken by `recv_nowait` back in front: the next `recv` / `recv_nowait` returns it."""
        self._pending.appendleft(item)

    def unread_error(self, exc: ProtocolError) -> None:
        """An error `recv_nowait` raised, raised again by the next `recv` / `recv_nowait` (after what is queued)."""
        self._error = exc

    def take_pending(self, keep: Callable[[Any], bool]) -> None:
        """Drop queued messages for which keep(message) is False (already handled)."""
        self._pending = collections.deque(item for item in self._pending if keep(item[0]))

    def close(self) -> None:
        self._sock.close()  # sends block until written: nothing is left to linger for


# every signal a thread may block but those the kernel raises in the thread that faults (blocked, they kill the
# process without its handler: faulthandler's tracebacks)
_BLOCKED_SIGNALS = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS,
                                             signal.SIGFPE, signal.SIGILL, signal.SIGABRT}


class HeartbeatThread(threading.Thread):
    """Answers the supervisor's heartbeats on a socket of its own (`identity + "/hb"`, a DealerSocket: no
    libzmq I/O thread in between), and sleeps in between: the supervisor sets the pace (every interval
    while the worker has work, rarely while it is idle: supervisor/instances/liveness.py), so an idle
    worker wakes only when asked. With `timeout_s` > 0, `on_lost` is called when nothing came from the
    supervisor for that long. With a `metrics` sender (metrics_sender.MetricsSender), what changed in the
    models' custom metrics is sent after each answer (the runtime flushes it too, before each answer).
    `interval_s` is kept for the callers' sake: the worker no longer times heartbeats itself."""

    def __init__(
        self,
        context: Any,
        endpoint: str,
        identity: str,
        interval_s: float,
        timeout_s: float,
        on_lost: Callable[[str], None],
        metrics: Any = None,
    ) -> None:
        super().__init__(name="inferd-heartbeat", daemon=True)
        self._endpoint = endpoint
        self._identity = identity + "/hb"
        self._timeout = float(timeout_s or 0.0)
        self._on_lost = on_lost
        self._metrics = metrics  # metrics_sender.MetricsSender: flush()
        self._stop_read, self._stop_write = os.pipe()  # stop() wakes the thread's poll through it
        self._pipe_lock = threading.Lock()  # the pipe is closed when the thread ends: never written after
        self._stopped = False
        self.sent = 0
        self.heard = 0

    def stop(self) -> None:
        with self._pipe_lock:
            self._stopped = True
            if self._stop_write >= 0:
                try:
                    os.write(self._stop_write, b"\0")
                except OSError:
                    pass

    def _close_pipe(self) -> None:
        """(a process hosting workers, the Python API's, starts one such thread per worker it runs)"""
        with self._pipe_lock:
            for fd in (self._stop_read, self._stop_write):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._stop_read = self._stop_write = -1

    def run(self) -> None:
        # the process's signals go to its other threads: a signal the kernel hands to a thread that sleeps in
        # poll() wakes it for nothing (Python runs handlers on the main thread anyway)
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED_SIGNALS)
        try:
            try:
                sock = DealerSocket(self._endpoint, self._identity.encode("utf-8"))
            except ProtocolError as exc:
                if not self._stopped:
                    self._on_lost("no heartbeat link to the supervisor: %s" % exc)
                return
            try:
                self._loop(sock)
            except ProtocolError as exc:  # LinkClosed: the supervisor closed it (it is gone) or broke ZMTP
                if not self._stopped:
                    self._on_lost("heartbeat link: %s" % exc)
            finally:
                sock.close()
        finally:
            self._close_pipe()
            if self._metrics is not None:
                self._metrics.close()

    def _loop(self, sock: DealerSocket) -> None:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._stop_read, select.POLLIN)
        last_heard = time.monotonic()
        while not self._stopped:
            if self._timeout > 0:  # no cap on the wait: nothing wakes this thread but the supervisor
                wait_ms = max(0, int((last_heard + self._timeout - time.monotonic()) * 1000) + 1)
                poller.poll(wait_ms)
            else:
                poller.poll()
            if self._stopped:
                return
            last_heard = self._answer(sock, last_heard)
            if self._timeout > 0 and time.monotonic() - last_heard > self._timeout:
                # this thread may just have waited for the GIL (a model in a long C call): what the
                # supervisor sent meanwhile is queued, so read it before deciding it is gone
                last_heard = self._answer(sock, last_heard)
                if time.monotonic() - last_heard > self._timeout:
                    self._on_lost("no heartbeat from the supervisor for %.1f s" % self._timeout)
                    return

    def _answer(self, sock: DealerSocket, last_heard: float) -> float:
        """Answer every heartbeat waiting (its own seq back); returns when the supervisor was last heard."""
        answered = False
        while True:
            parts = sock.recv_multipart(False)
            if parts is None:
                break
            try:
                message, _ = decode([bytes(p) for p in parts])
            except ProtocolError:
                continue
            if isinstance(message, Heartbeat):
                last_heard = time.monotonic()
                self.heard += 1
                sock.send_multipart(encode(Heartbeat(seq=message.seq)))
                self.sent += 1
                answered = True
        if answered and self._metrics is not None:
            self._metrics.flush()  # the models' custom metrics that changed since the last report
        return last_heard
