"""Direct peers: frontend processes that send a worker its batches themselves, beside the supervisor.

The supervisor sends Attach(endpoint) on the main socket; the worker connects one more DEALER there, with
its main socket's identity (docs/worker-protocol.md, "Direct peers"). A peer may send Execute,
ExecuteColumns, Cancel and ReleaseOutputs; anything else, or a malformed message, drops that peer's socket,
never the worker. Each peer keeps its own Cancels (request ids are chosen by each sender) and the output
regions handed to it: a peer that goes away gives them back.

While no peer is attached the message loop reads the main socket alone, as before (busy polling included);
with peers, `next_message` serves every socket: messages already read (a socket's buffer, or read ahead
while a model polled for Cancels) first, else one blocking poll() over all sockets; sources take turns.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from .channel import Channel
from .wire.messages import Cancel, Execute, ExecuteColumns, ProtocolError, ReleaseOutputs
from .zmtp_socket import MAX_POLL_US, LinkClosed

MAX_PEERS = 64
# the most an Attach may hold the worker (the main socket waits meanwhile): the peer listens before the
# supervisor sends it, so the connection and handshake take microseconds unless that frontend is stuck
ATTACH_TIMEOUT_S = 2.0
# a peer that takes none of a reply for this long is dropped: the worker (and the core's requests) must not wait
# on a frontend that stopped reading
SEND_TIMEOUT_S = 10.0
PEER_MESSAGES = frozenset((Execute, ExecuteColumns, Cancel, ReleaseOutputs))


class DirectPeer:
    """One frontend's socket and what the worker keeps for it."""

    def __init__(self, endpoint: str, channel: Channel) -> None:
        self.endpoint = endpoint
        self.channel = channel
        self.cancelled: set[int] = set()  # this peer's Cancels (its request ids)
        self.regions: set[str] = set()  # output regions handed to this peer and not given back
        self.lost: Optional[str] = None  # why a reply could not go: the peer is dropped after its message
        self.probe: Optional[Callable[[int], bool]] = None  # is_cancelled for its requests in a merged batch
        self.hold = False  # replies wait for `flush` (set by the message loop while more messages wait)

    def send_encoded(self, header: bytes, frames: Sequence[Any] = ()) -> None:
        """A reply to this peer (the message loop's reply target while it handles the peer's message): a
        peer that went away is noted in `lost`, never raised (the worker goes on)."""
        if self.lost is not None:
            return
        try:
            self.channel.send_encoded(header, frames, self.hold)
        except ProtocolError as exc:
            self.lost = str(exc)

    def flush(self) -> None:
        """Write the replies held for this peer (a peer that went away is noted in `lost`)."""
        if self.lost is not None:
            return
        try:
            self.channel.flush()
        except ProtocolError as exc:
            self.lost = str(exc)


class DirectPeers:
    """The attached peers of one worker (main thread only). `release(regions)` gives output regions back
    (ResultWriter.release's shm half); `log` is the worker's log."""

    def __init__(self, main: Channel, log: Callable[[str], None], release: Callable[[list[str]], None]) -> None:
        self._main = main
        self._log = log
        self._release = release
        self._peers: dict[str, DirectPeer] = {}  # endpoint -> peer
        # [(None, main channel), (peer, its channel), ...]: whose turn is next is `_turn`
        self._sources: list[tuple[Optional[DirectPeer], Channel]] = [(None, main)]
        self._turn = 0
        self._poller: Any = None  # select.poll over every source (and the wake-up fd): rebuilt on change
        self._by_fd: dict[int, int] = {}  # fd -> index in _sources
        self._wake_fd = -1
        self._on_wake: Optional[Callable[[], None]] = None
        self._poll_until = 0.0  # next_message polls (instead of sleeping in poll()) until then: poll_next

    def __len__(self) -> int:
        return len(self._peers)

    def peers(self) -> list[DirectPeer]:
        return list(self._peers.values())

    def watch(self, fd: int, on_wake: Callable[[], None]) -> None:
        """Also wait for `fd` (a decoupled model's Outbox pipe); `on_wake()` runs when it turns readable."""
        self._wake_fd, self._on_wake = fd, on_wake
        self._poller = None

    # ---- attaching and dropping -----------------------------------------------------------------

    def attach(self, endpoint: str) -> None:
        """Connect to `endpoint`; a failure is logged and nothing else happens. A second Attach to the same
        endpoint replaces the old socket once the new one is connected (the peer sees its new connection
        before the old one closes: a reconnect, not a loss)."""
        old = self._peers.get(endpoint)
        if old is None and len(self._peers) >= MAX_PEERS:
            self._log("direct peer %s refused: %d peers are attached already (the most)" % (endpoint, MAX_PEERS))
            return
        try:
            channel = Channel(endpoint, self._main.identity, ATTACH_TIMEOUT_S)
            channel.set_send_timeout(SEND_TIMEOUT_S)
        except (ProtocolError, ValueError, OSError) as exc:
            self._log("cannot attach to direct peer %s: %s" % (endpoint, exc))
            return
        if old is not None:
            self._close(old)
        self._peers[endpoint] = DirectPeer(endpoint, channel)
        self._changed()
        self._log("direct peer %s attached (%d attached)" % (endpoint, len(self._peers)))

    def drop(self, peer: DirectPeer, reason: str, warn: bool) -> None:
        """Close `peer`'s socket, discard what it sent and was not handled, and take back the output regions
        it held. `warn`: it broke the protocol (else it went away: an INFO line)."""
        if self._peers.get(peer.endpoint) is not peer:
            return
        del self._peers[peer.endpoint]
        self._close(peer)
        self._changed()
        self._log("%s: direct peer %s dropped: %s" % ("WARNING" if warn else "INFO", peer.endpoint, reason))

    def _close(self, peer: DirectPeer) -> None:
        peer.channel.close()
        regions, peer.regions = list(peer.regions), set()
        if regions:
            self._release(regions)
        peer.cancelled.clear()

    def close(self) -> None:
        """Close every peer's socket (the worker is ending)."""
        for peer in list(self._peers.values()):
            self._close(peer)
        self._peers.clear()
        self._changed()

    def _changed(self) -> None:
        self._sources = [(None, self._main)] + [(p, p.channel) for p in self._peers.values()]
        self._turn = 0
        self._poller = None

    # ---- what peers send --------------------------------------------------------------------------

    def release(self, peer: DirectPeer, regions: Any) -> None:
        """ReleaseOutputs from `peer`: only regions handed to that peer are given back."""
        if type(regions) is not list or not all(type(r) is str for r in regions):
            raise ProtocolError("malformed release_outputs message")
        owned = [r for r in regions if r in peer.regions]
        if owned:
            peer.regions.difference_update(owned)
            self._release(owned)

    def not_held(self, regions: list[str]) -> list[str]:
        """Those of `regions` (a ReleaseOutputs from the supervisor) that no peer holds."""
        held = [peer.regions for peer in self._peers.values() if peer.regions]
        if not held or type(regions) is not list:
            return regions
        return [r for r in regions if type(r) is not str or not any(r in h for h in held)]

    def read_cancels(self) -> None:
        """Take the Cancels already waiting on every peer's socket (the rest stays queued, in order); a
        socket's error is met by the next `next_message`."""
        for peer in list(self._peers.values()):
            got = peer.channel.read_ahead()
            ids = [m.request_ids for m, _ in got if type(m) is Cancel and valid_ids(m.request_ids)]
            if ids:
                for request_ids in ids:
                    peer.cancelled.update(request_ids)
                peer.channel.take_pending(lambda m: not (type(m) is Cancel and valid_ids(m.request_ids)))

    def waiting(self) -> bool:
        """A message is already read and waiting on some source (the next `next_message` takes it at once)."""
        return any(channel.buffered() for _, channel in self._sources)

    def flush(self) -> bool:
        """Write every peer's held replies; a peer whose write failed is dropped (then True)."""
        dropped = False
        for peer in list(self._peers.values()):
            if peer.channel.holding:
                peer.flush()
                if peer.lost is not None:
                    self.drop(peer, "its reply could not be sent: %s" % peer.lost, False)
                    dropped = True
        return dropped

    def next_message(self) -> Optional[tuple[Optional[DirectPeer], Any, Sequence[Any]]]:
        """(peer or None for the main socket, message, data frames), blocking until one comes; None when
        the set of sources changed (a peer dropped) or the wake-up fd fired: ask again. The main socket's
        errors are raised (they end the worker); a peer's drop that peer."""
        sources = self._sources
        count = len(sources)
        turn = self._turn
        order = [(turn + k) % count for k in range(count)] if turn else range(count)
        ready = [i for i in order if sources[i][1].buffered()]
        if not ready:
            if self.flush():  # (the loop flushes once nothing waits: nothing held may wait on a sleep)
                return None  # a peer dropped: the sources changed
            poller = self._poller or self._build()
            polled = self._polled(poller) if self._poll_until else None
            # POLLHUP / POLLERR end the wait too: the read tells
            fds = [fd for fd, _ in (polled if polled is not None else poller.poll())]
            if self._wake_fd in fds and self._on_wake is not None:
                self._on_wake()
            by_fd = self._by_fd
            hit = {by_fd[fd] for fd in fds if fd in by_fd}
            ready = [i for i in order if i in hit]
        for i in ready:
            peer, channel = sources[i]
            try:
                got = channel.recv_nowait()
            except ProtocolError as exc:
                if peer is None:
                    raise
                self.drop(peer, str(exc), not isinstance(exc, LinkClosed) or "broke" in str(exc))
                return None
            if got is not None:
                self._turn = (i + 1) % count
                return peer, got[0], got[1]
        return None

    def poll_next(self, us: int) -> None:
        """The next `next_message` checks every source for up to `us` µs, yielding the CPU between checks,
        before it sleeps (an Execute asked: its sender polls too, and expects its next request soon)."""
        self._poll_until = time.monotonic() + min(us, MAX_POLL_US) / 1e6

    def _polled(self, poller: Any) -> Optional[list[tuple[int, int]]]:
        """poll()'s events as soon as there are some, until `_poll_until` (then None: the poll is over)."""
        until, self._poll_until = self._poll_until, 0.0
        poll, now, give_way = poller.poll, time.monotonic, os.sched_yield
        while True:
            events = poll(0)
            if events:
                return events  # type: ignore[no-any-return]
            if now() >= until:
                return None
            give_way()  # a runnable process on this CPU goes first

    def attached(self, peer: DirectPeer) -> bool:
        return self._peers.get(peer.endpoint) is peer

    def wait(self, timeout_ms: int) -> None:
        """Until a source is readable or `timeout_ms` passed (what arrived is then taken by `take_queued`)."""
        (self._poller or self._build()).poll(timeout_ms)

    def take_queued(self, want: Callable[[Any], bool]) -> list[tuple[Optional[DirectPeer], Any, Sequence[Any]]]:
        """Messages already waiting (read, or readable now: one poll without a wait) at the head of each source
        while want(message) says yes, source after source from the next turn, each source's in order; the first
        one refused is put back and ends that source. A peer's broken socket drops that peer; the main socket's
        error is left for `next_message`."""
        sources = self._sources
        count = len(sources)
        poller = self._poller or self._build()
        readable = {fd for fd, _ in poller.poll(0)}
        taken: list[tuple[Optional[DirectPeer], Any, Sequence[Any]]] = []
        for k in range(count):
            peer, channel = sources[(self._turn + k) % count]
            if not channel.buffered() and channel.fileno() not in readable:
                continue
            while True:
                try:
                    got = channel.recv_nowait()
                except ProtocolError as exc:
                    if peer is None:
                        channel.unread_error(exc)
                    else:
                        self.drop(peer, str(exc), not isinstance(exc, LinkClosed) or "broke" in str(exc))
                    break
                if got is None:
                    break
                if not want(got[0]):
                    channel.unread(got)
                    break
                taken.append((peer, got[0], got[1]))
        if self._sources is not sources:  # (a peer dropped: the turn restarts)
            self._turn = 0
        return taken

    def _build(self) -> Any:
        poller = select.poll()
        self._by_fd = {}
        for i, (_, channel) in enumerate(self._sources):
            fd = channel.fileno()
            self._by_fd[fd] = i
            poller.register(fd, select.POLLIN)
        if self._wake_fd >= 0:
            poller.register(self._wake_fd, select.POLLIN)
        self._poller = poller
        return poller


def valid_ids(request_ids: Any) -> bool:
    return type(request_ids) is list and all(type(r) is int for r in request_ids)
