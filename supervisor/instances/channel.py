"""The endpoint all workers connect to (the only link between the supervisor and its workers).

Workers connect ZeroMQ DEALER sockets to `ipc://<run_dir>/workers.sock` (their main socket speaks ZMTP
itself, the heartbeat and BLS sockets are libzmq's); the supervisor listens there itself and speaks
ZeroMQ's wire protocol on its event loop (inferd.worker.wire.zmtp) with ROUTER semantics: each
connection announces its identity in the ZMTP handshake, messages are routed by it to a handler
registered per worker, and a worker's heartbeat socket is `<identity>/hb`. Without a ZeroMQ context
here, messages to a worker are socket writes (held ones grouped per event-loop pass: _Peer) and
messages from it reads, with no I/O thread hand-off on this side.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from inferd.worker.wire import zmtp
from inferd.worker.wire.errors import ErrorCode, InferdError

log = logging.getLogger("inferd.instances.channel")

Handler = Callable[[list[Any]], None]  # receives the message frames (memoryviews), identity removed
HB_SUFFIX = "/hb"
_MAX_SUN_PATH = 107
_MAX_FRAME = 1 << 30  # a worker frame larger than this breaks the protocol (tensors this big go in shm)
_MAX_UNSENT = 256 << 20  # bytes queued for a worker that is not reading before sends are refused
_anonymous = itertools.count(1)


class ChannelError(InferdError):
    pass


class Channel:
    """Listens at `ipc://<run_dir>/<name>` (the core's `workers.sock`; a frontend process listens at a name of
    its own for workers' direct links, docs/worker-protocol.md "Direct peers"); `open()` must run on the
    event-loop thread."""

    def __init__(self, run_dir: str, name: str = "workers.sock") -> None:
        if not name or "/" in name:
            raise ValueError(f"a socket file name, not a path: {name!r}")
        self.path = os.path.join(os.path.abspath(run_dir), name)
        if len(self.path.encode()) > _MAX_SUN_PATH:
            raise ValueError(f"run dir path too long for an ipc socket: {self.path}")
        self.endpoint = "ipc://" + self.path
        self._listener: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None
        self._peers: dict[str, _Peer] = {}  # identity -> its connection
        self._connections: set[_Peer] = set()
        self._handlers: dict[str, Handler] = {}
        self._on_broken: dict[str, Callable[[str], None]] = {}  # worker identity -> told of protocol violations
        self._on_lost: dict[str, Callable[[str], None]] = {}  # worker identity -> told its main connection is gone
        self._on_ready: dict[str, Callable[[str], None]] = {}  # worker identity -> told its main socket connected
        # extra per-worker sockets (e.g. "/bls"): suffix -> (handler(identity, frames), on_gone(worker identity))
        self._suffix_routes: dict[str, tuple[Callable[[str, list[Any]], None], Callable[[str], None]]] = {}
        self.dropped = 0  # messages from unknown identities (late replies of dead workers)

    # ---- lifecycle ----
    def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)  # the socket file is ours alone
        try:
            listener.bind(self.path)
        finally:
            os.umask(old_umask)
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        # bound and listening now (workers may connect at once); accepting starts on the next loop pass
        self._starting = loop.create_task(self._serve(listener))

    async def _serve(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Peer(self), sock=listener)

    def close(self) -> None:
        if self._listener is None:
            return
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
        if self._server is not None:
            self._server.close()
        else:
            self._listener.close()
        for peer in list(self._connections):
            peer.abort()
        self._listener = self._server = self._starting = None
        self._peers.clear()
        self._connections.clear()
        self._handlers.clear()
        self._on_broken.clear()
        self._on_lost.clear()
        self._on_ready.clear()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def is_open(self) -> bool:
        return self._listener is not None

    # ---- routing ----
    def register(self, identity: str, handler: Handler, heartbeat_handler: Handler,
                 on_broken: Callable[[str], None] | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 on_ready: Callable[[str], None] | None = None) -> None:
        """Route a worker's messages; `on_broken(reason)` runs when one of its sockets breaks the
        protocol (its connection is dropped, so whatever it was answering is lost); `on_lost(identity)`
        when the connection of `identity` itself (its main socket) is lost, unless a newer connection of
        that identity had already taken its place (a reconnect), and never after `close()`; `on_ready(identity)`
        each time a connection of `identity` finishes its handshake (messages can be sent to it from then on)."""
        self._handlers[identity] = handler
        self._handlers[identity + HB_SUFFIX] = heartbeat_handler
        if on_broken is not None:
            self._on_broken[identity] = on_broken
        if on_lost is not None:
            self._on_lost[identity] = on_lost
        if on_ready is not None:
            self._on_ready[identity] = on_ready

    def unregister(self, identity: str) -> None:
        self._handlers.pop(identity, None)
        self._handlers.pop(identity + HB_SUFFIX, None)
        self._on_broken.pop(identity, None)
        self._on_lost.pop(identity, None)
        self._on_ready.pop(identity, None)
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
        self._suffix_routes[suffix] = (handler, on_gone)

    def _route_extra(self, ident: str, frames: list[Any]) -> bool:
        cut = ident.find("/")  # "<worker>/<suffix>[/<n>]": a worker may open several such sockets
        if cut < 0 or ident[:cut] not in self._handlers:
            return False
        tail = ident[cut:]
        for suffix, (handler, _) in self._suffix_routes.items():
            if tail == suffix or tail.startswith(suffix + "/"):
                try:
                    handler(ident, frames)
                except Exception:
                    log.exception("worker message handler failed")
                return True
        return False

    def _deliver(self, identity: str, frames: list[Any]) -> None:
        handler = self._handlers.get(identity)
        if handler is None:
            if self._suffix_routes and self._route_extra(identity, frames):
                return
            self.dropped += 1
            log.debug("dropping a message from unknown worker %r", identity)
            return
        try:
            handler(frames)
        except Exception:
            log.exception("worker message handler failed")

    def _peer_ready(self, peer: _Peer) -> None:
        # a reconnecting worker's new connection takes over its identity (ZeroMQ's ROUTER handover)
        self._peers[peer.identity] = peer
        _tell(self._on_ready.get(peer.identity), peer.identity, "connection-ready")

    def is_connected(self, identity: str) -> bool:
        """A connection of `identity` has finished its handshake and is open."""
        return identity in self._peers

    def _peer_broken(self, peer: _Peer, reason: str) -> None:
        log.warning("dropping a worker connection (%s): %s", peer.identity or "before handshake", reason)
        _tell(self._on_broken.get(peer.identity.split("/", 1)[0]) if peer.identity else None, reason,
              "protocol-violation")

    def _peer_lost(self, peer: _Peer) -> None:
        self._connections.discard(peer)
        if self._peers.get(peer.identity) is peer:
            del self._peers[peer.identity]
            _tell(self._on_lost.get(peer.identity), peer.identity, "connection-lost")

    # ---- sending ----
    def send(self, identity: str, frames: Sequence[Any], hold: bool = False) -> None:
        """Send one message to a worker; raises ChannelError(UNAVAILABLE) if it cannot. `hold`: written
        at the end of this event-loop pass, with the messages of the pass that follow it (for a worker
        with work queued, which reads it no sooner when written at once)."""
        peer = self._peers.get(identity)
        if peer is None:
            if self._listener is None:
                raise ChannelError(ErrorCode.UNAVAILABLE, "worker channel is closed")
            raise ChannelError(ErrorCode.UNAVAILABLE, f"worker '{identity}' is not connected")
        if peer.transport.get_write_buffer_size() + peer.held > _MAX_UNSENT:
            raise ChannelError(ErrorCode.UNAVAILABLE, f"worker '{identity}' is not reading")
        whole, pieces = zmtp.encode(frames)
        peer.write(whole, pieces, hold)

    def broadcast(self, frames: Sequence[Any]) -> int:
        """Best effort: send one message to every connected worker's main socket; how many got it."""
        sent = 0
        for identity in [i for i in self._handlers if not i.endswith(HB_SUFFIX)]:
            try:
                self.send(identity, frames)
                sent += 1
            except ChannelError:
                pass  # not connected yet (it gets the settings before LoadModel) or gone
        return sent

    def send_heartbeat(self, identity: str, frames: Sequence[Any]) -> bool:
        """Best effort: False when the worker's heartbeat socket is not (or no longer) connected."""
        try:
            self.send(identity + HB_SUFFIX, frames)
        except ChannelError:
            return False
        return True

    async def settle(self) -> None:
        """Let the event loop read what is queued on the connections now (e.g. before judging a worker
        silent after the loop was busy): two passes, since a resumed coroutine may run before the
        I/O poll of the pass that resumes it."""
        for _ in range(2):
            await asyncio.sleep(0)


def _tell(handler: Callable[[str], None] | None, arg: str, what: str) -> None:
    """Call a registered handler, if any; its failure is logged, never raised into the channel."""
    if handler is not None:
        try:
            handler(arg)
        except Exception:
            log.exception("worker %s handler failed", what)


class _Peer(asyncio.Protocol):
    """One worker socket's connection: ZMTP handshake, then frames gathered into messages.

    Messages to the worker are written at once, unless the sender says `hold` (an Execute for a worker
    with batches in flight: it reads it no sooner when written at once): then it waits for the end of
    this event-loop pass and is written with every other message of the pass that follows it (e.g. the
    Executes of several slots freed by one read of results): one write, and one wake-up of the worker,
    instead of one each. Order is kept (once one message is held, every later one of the pass is)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.transport: Any = None
        self.identity = ""
        self.held = 0  # bytes held for the end of this pass (counted against the unsent limit)
        self._held: list[Any] | None = None  # None: nothing held in this pass
        self._call_soon: Any = None
        self._ready = False
        self._messages = zmtp.Messages(self._on_command, self._on_message)
        self._reader = zmtp.Reader(zmtp.check_greeting, self._messages.on_frame, _MAX_FRAME)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._call_soon = asyncio.get_running_loop().call_soon
        self.channel._connections.add(self)
        self.transport.write(zmtp.GREETING + zmtp.ready(b"ROUTER"))

    def write(self, whole: bytes, pieces: list[Any], hold: bool = False) -> None:
        """One encoded message (zmtp.encode's result): written now, or held until the pass ends."""
        held = self._held
        if held is None:  # nothing held in this pass
            if not hold:
                if pieces:
                    self.transport.writelines(pieces)
                else:
                    self.transport.write(whole)
                return
            held = self._held = []
            self._call_soon(self._end_pass)
        if pieces:
            held.extend(pieces)
            self.held += sum(len(p) if type(p) is bytes else memoryview(p).nbytes for p in pieces)
        else:
            held.append(whole)
            self.held += len(whole)

    def _end_pass(self) -> None:
        held, self._held = self._held, None
        self.held = 0
        if held and not self.transport.is_closing():
            if len(held) == 1:
                self.transport.write(held[0])
            else:
                self.transport.writelines(held)

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except zmtp.ProtocolViolation as exc:
            self.abort()
            self.channel._peer_broken(self, str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._peer_lost(self)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _on_message(self, parts: list[memoryview]) -> None:
        if not self._ready:
            raise zmtp.ProtocolViolation("message before the handshake")
        channel = self.channel
        handler = channel._handlers.get(self.identity)
        if handler is None:
            channel._deliver(self.identity, parts)  # (routed by suffix, or dropped)
            return
        try:  # (Channel._deliver, inline: one call less per message)
            handler(parts)
        except Exception:
            log.exception("worker message handler failed")

    def _on_command(self, body: memoryview) -> None:
        name, rest = zmtp.parse_command(body)
        if name == b"READY":
            if self._ready:
                raise zmtp.ProtocolViolation("a second READY")
            props = zmtp.parse_properties(rest)
            if props.get(b"socket-type") not in zmtp.COMPATIBLE_PEERS:
                raise zmtp.ProtocolViolation(f"a {props.get(b'socket-type')!r} socket cannot talk to a ROUTER")
            ident = props.get(b"identity")
            # a socket without an identity gets one no handler has (its messages are dropped)
            self.identity = ident.decode("utf-8", "surrogateescape") if ident else f"\x00{next(_anonymous)}"
            self._ready = self._messages.handshaken = True
            self.channel._peer_ready(self)
        elif name == b"PING":  # heartbeat option of the worker's socket: answer with its context
            self.transport.write(zmtp.command(b"PONG", bytes(rest[2:18])))
        elif name == b"ERROR":
            raise zmtp.ProtocolViolation("the peer reported an error: %r" % bytes(rest[1:]))
