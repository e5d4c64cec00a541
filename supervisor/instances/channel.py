"""The one ROUTER socket all workers connect to (the only ZeroMQ user in the supervisor).

Read on the event loop with `loop.add_reader` on the socket's FD and non-blocking drains: ZeroMQ's FD
is edge-triggered, so every wake-up drains until EAGAIN, and after every send the socket's EVENTS are
checked (a send can consume the FD's edge while messages wait). Messages are routed by the sender's
identity to a handler registered per worker; a worker's heartbeat socket is `<identity>/hb`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from inferd.worker.wire.errors import ErrorCode, InferdError

log = logging.getLogger("inferd.instances.channel")

Handler = Callable[[list[Any]], None]  # receives the message frames (zmq.Frame), identity removed
HB_SUFFIX = "/hb"
_DRAIN_BATCH = 512  # messages per wake-up before yielding to other callbacks
_MAX_SUN_PATH = 107
# pyzmq's Socket sugar converts options and flags through enum classes on every call (a few µs per
# message); the hot path calls the backend methods with plain ints instead.
_raw_get: Callable[[Any, int], int] = zmq.backend.Socket.get  # type: ignore[assignment]
_raw_send = zmq.backend.Socket.send
_raw_recv = zmq.backend.Socket.recv
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_ZERO_COPY_MIN = zmq.COPY_THRESHOLD  # smaller frames are copied (pyzmq would copy them anyway)


class ChannelError(InferdError):
    pass


class Channel:
    """ROUTER bound at `ipc://<run_dir>/workers.sock`; `open()` must run on the event-loop thread."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(os.path.abspath(run_dir), "workers.sock")
        if len(self.path.encode()) > _MAX_SUN_PATH:
            raise ValueError(f"run dir path too long for an ipc socket: {self.path}")
        self.endpoint = "ipc://" + self.path
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handlers: dict[bytes, Handler] = {}
        # extra per-worker sockets (e.g. "/bls"): suffix -> (handler(identity, frames), on_gone(worker identity))
        self._suffix_routes: dict[bytes, tuple[Callable[[str, list[Any]], None], Callable[[str], None]]] = {}
        self._drain_scheduled = False
        self.dropped = 0  # messages from unknown identities (late replies of dead workers)

    # ---- lifecycle ----
    def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx: zmq.Context[Any] = zmq.Context(io_threads=1)
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown/disconnected peer: EHOSTUNREACH, not a drop
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        old_umask = os.umask(0o077)  # the socket file is ours alone
        try:
            sock.bind(self.endpoint)
        finally:
            os.umask(old_umask)
        self._ctx, self._sock = ctx, sock
        self._fd = sock.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._drain)
        # messages may already be queued (none at bind, but keep the invariant: drain after setup)
        self._schedule_drain()

    def close(self) -> None:
        if self._sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._sock.close(linger=0)
        assert self._ctx is not None
        self._ctx.term()
        self._sock = None
        self._ctx = None
        self._handlers.clear()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    # ---- routing ----
    def register(self, identity: str, handler: Handler, heartbeat_handler: Handler) -> None:
        ident = identity.encode()
        self._handlers[ident] = handler
        self._handlers[ident + HB_SUFFIX.encode()] = heartbeat_handler

    def unregister(self, identity: str) -> None:
        ident = identity.encode()
        self._handlers.pop(ident, None)
        self._handlers.pop(ident + HB_SUFFIX.encode(), None)
        for _, on_gone in self._suffix_routes.values():
            try:
                on_gone(identity)
            except Exception:
                log.exception("worker departure handler failed")

    def route_suffix(self, suffix: str, handler: Callable[[str, list[Any]], None],
                     on_gone: Callable[[str], None]) -> None:
        """Messages from `<identity><suffix>` (or `<identity><suffix>/<n>`) of a registered worker go to
        handler(full identity, frames);
        on_gone(identity) runs when that worker is unregistered."""
        self._suffix_routes[suffix.encode()] = (handler, on_gone)

    def _route_extra(self, ident: bytes, frames: list[Any]) -> bool:
        cut = ident.find(b"/")  # "<worker>/<suffix>[/<n>]": a worker may open several such sockets
        if cut < 0 or ident[:cut] not in self._handlers:
            return False
        tail = ident[cut:]
        for suffix, (handler, _) in self._suffix_routes.items():
            if tail == suffix or tail.startswith(suffix + b"/"):
                try:
                    handler(ident.decode(), frames)
                except Exception:
                    log.exception("worker message handler failed")
                return True
        return False

    def send(self, identity: str, frames: Sequence[Any]) -> None:
        """Send one message to a worker; raises InferdError(UNAVAILABLE) if it cannot.

        Frames are sent one by one with plain int flags (pyzmq's send_multipart builds enum flags per
        frame); small frames are copied into the message (cheaper than a zero-copy Frame), frames of
        at least _ZERO_COPY_MIN bytes go zero-copy. A multipart message is atomic in ZeroMQ: once the
        identity frame is accepted the remaining frames cannot fail for HWM or routing.
        """
        sock = self._sock
        if sock is None:
            raise ChannelError(ErrorCode.UNAVAILABLE, "worker channel is closed")
        send = _raw_send
        try:
            last = len(frames) - 1
            send(sock, identity.encode(), _MORE if last >= 0 else _NOBLOCK)
            for i, frame in enumerate(frames):
                flags = _MORE if i < last else _NOBLOCK
                if type(frame) is bytes and len(frame) < _ZERO_COPY_MIN:
                    send(sock, frame, flags)
                else:
                    nbytes = frame.nbytes if type(frame) is memoryview else memoryview(frame).nbytes
                    send(sock, frame, flags, nbytes < _ZERO_COPY_MIN)
        except zmq.Again:
            raise ChannelError(ErrorCode.UNAVAILABLE, f"worker '{identity}' is not reading") from None
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                raise ChannelError(ErrorCode.UNAVAILABLE, f"worker '{identity}' is not connected") from None
            raise ChannelError(ErrorCode.UNAVAILABLE, f"send to worker '{identity}' failed: {exc}") from None
        finally:
            self._after_send()

    def send_heartbeat(self, identity: str, frames: Sequence[Any]) -> bool:
        """Best effort: False when the worker's heartbeat socket is not (or no longer) connected."""
        try:
            self.send(identity + HB_SUFFIX, frames)
        except ChannelError:
            return False
        return True

    # ---- reading ----
    def poll_now(self) -> None:
        """Read everything queued now (e.g. before judging a worker silent after the loop was busy)."""
        self._drain()

    def _after_send(self) -> None:
        sock = self._sock
        if sock is not None and not self._drain_scheduled and _raw_get(sock, _EVENTS) & _POLLIN:
            self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self._sock
        if sock is None:
            return
        handlers = self._handlers
        for _ in range(_DRAIN_BATCH):
            # EVENTS (about 1.5 us) both tells whether a message waits and re-arms the edge-triggered
            # FD; cheaper than ending every drain with a zmq.Again exception (about 4 us).
            try:
                if not _raw_get(sock, _EVENTS) & _POLLIN:
                    return
                frame = _raw_recv(sock, _NOBLOCK, False)
                frames = [frame]
                while frame.more:  # the Frame's own flag: no getsockopt(RCVMORE) call per frame
                    frame = _raw_recv(sock, _NOBLOCK, False)
                    frames.append(frame)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # socket closed underneath us
                log.debug("channel recv failed: %s", exc)
                return
            handler = handlers.get(frames[0].bytes)
            if handler is None:
                if self._suffix_routes and self._route_extra(frames[0].bytes, frames[1:]):
                    continue
                self.dropped += 1
                log.debug("dropping a message from unknown worker %r", frames[0].bytes)
                continue
            try:
                handler(frames[1:])
            except Exception:
                log.exception("worker message handler failed")
            if self._sock is None:
                return
        self._schedule_drain()  # more may be waiting: continue after other callbacks had a turn
