"""The message loop's serving of direct peers (a mixin of message_loop.Runtime; the peers themselves:
direct_peers.py; docs/worker-protocol.md "Direct peers").

With peers attached the loop reads every socket (`_run_direct`); a peer's message is handled with that peer as
its origin: its Cancels, its socket for the reply, the output regions handed to it (`_handle_as`). For a
dynamic-batching model the Executes already waiting on every socket run as one execute() (merged_serving.py),
each sender answered on its own socket. Kept apart from message_loop.py so that the main socket's loop stays
what it was; the attributes below are Runtime's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

from .backends.base import ModelSpec
from .channel import Channel
from .direct_peers import PEER_MESSAGES, DirectPeer, DirectPeers, valid_ids
from .merged_serving import EXECUTES, mostly_waits
from .outbox import Outbox
from .result_writer import ResultWriter
from .thread_busy import busy_ns
from .wire.errors import ErrorCode
from .wire.messages import Attach, Cancel, Execute, ProtocolError, ReleaseOutputs, WireError

_now_ns = time.perf_counter_ns
# what the core may send while the merge thread runs a batch without waiting for it (the rest waits: a Shutdown)
_ALONGSIDE = frozenset((Cancel, ReleaseOutputs))
# A reply to a peer waits for one write with the replies after it while more messages are already read and
# waiting, the model is fast, and the oldest reply held is younger than this: a frontend woken once per write,
# not per reply, spent a third less CPU per request with 2 frontends on 2 vCPUs (bench/RESULTS.md, 2026-12-08)
_HOLD_NS = 200_000
_FAST_NS = 100_000  # a message handled within this is "fast"
_FAST_STREAK = 4  # replies are held only after this many fast messages in a row (a model that is fast now)


def any_requests_batch(config: dict[str, Any]) -> bool:
    """Whether any two requests of this batching model may share a batch: no shape tensor, no optional input and
    no variable dimension outside ragged batching (the supervisor's scheduler/batching.BatchRules: nothing to
    match). Only such a model's queued batches are merged (the frontends send only such models' directly)."""
    for inp in config.get("input") or ():
        if not isinstance(inp, dict):
            return False
        dims = inp.get("dims") or []
        if inp.get("is_shape_tensor") or inp.get("optional"):
            return False
        if any(_dim(d) < 0 for d in dims) and not inp.get("allow_ragged_batch"):
            return False
    return True


def _dim(value: Any) -> int:
    """A config dim (Triton's JSON renders int64 as a string); -1 for anything that is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


class DirectServing:
    """Runtime's direct-peer half (see the module docstring)."""

    # Runtime's state this half uses (set by Runtime.__init__ and its handlers)
    _handlers: dict[type[Any], Callable[[Any, Sequence[Any]], None]]
    _results: ResultWriter
    _channel: Channel
    _cancelled: set[int]
    _main_cancelled: set[int]
    _is_cancelled: Callable[[int], bool]
    _reply: Any
    _peers: Optional[DirectPeers]
    _outbox: Optional[Outbox]
    _spec: Optional[ModelSpec]
    _merge_max: int
    _merge_threaded: bool
    _polls: bool
    _running: bool
    _single: bool
    _log: Callable[[str], None]

    if TYPE_CHECKING:  # merged_serving.MergedServing's (declared only: a stub here would hide them)
        def _run_merged(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any,
                        frames: Sequence[Any]) -> bool:
            raise NotImplementedError

        def _merge_busy(self) -> bool:
            raise NotImplementedError

        def _defer(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> None:
            raise NotImplementedError

        def _merge_done(self) -> bool:
            raise NotImplementedError

        def _merged_ended(self, peers: DirectPeers) -> None:
            raise NotImplementedError

        def _drain_merged(self, peers: DirectPeers) -> None:
            raise NotImplementedError

        def _executed(self, ns: int, senders: Sequence[Optional[DirectPeer]]) -> None:
            raise NotImplementedError

    def _run_direct(self, peers: DirectPeers) -> None:
        """The main socket and every direct peer's: until Shutdown or no peer is left. An Execute's poll_us has the
        wait for the next message poll every socket first, as the single socket's loop does. While the merge
        thread runs a batch (merged_serving.py) the Executes that come are held back for the next one."""
        held_since = 0  # when the oldest reply held for one write was sent (0: none is held)
        streak = 0  # messages handled within _FAST_NS in a row
        while self._running and len(peers):
            got = peers.next_message()
            if got is not None:
                peer, message, frames = got
                if self._merge_busy() and type(message) in EXECUTES:
                    self._defer(peers, peer, message, frames)
                else:
                    if self._merge_busy() and peer is None and type(message) not in _ALONGSIDE:
                        self._drain_merged(peers)  # a control message: after everything sent before it
                    if peer is None and held_since:  # the core's message comes after the replies held
                        peers.flush()
                        held_since = 0
                    holder = peer if peer is not None and streak >= _FAST_STREAK and peers.waiting() else None
                    t0 = _now_ns()
                    if holder is not None:
                        holder.hold = True
                        held_since = held_since or t0
                    self._handle(peers, peer, message, frames)
                    if holder is not None:
                        holder.hold = False
                    streak = streak + 1 if _now_ns() - t0 < _FAST_NS else 0
            if held_since and (not streak or not peers.waiting() or _now_ns() - held_since > _HOLD_NS):
                peers.flush()
                held_since = 0
            if self._merge_busy() and self._merge_done():  # (after a Cancel just read: it applies to the next)
                self._merged_ended(peers)
        peers.flush()
        if self._running:
            self._drain_merged(peers)  # no peer is left: the main socket's loop serves on

    def _handle(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> None:
        """A message taken now: an Execute of a merging model with what waits behind it, anything else alone."""
        # once answered, its sender expects the next one soon (it polls too): see _run_single
        poll_us = message.poll_us if type(message) in EXECUTES and self._polls and self._outbox is None else 0
        if type(poll_us) is not int or poll_us < 0:
            poll_us = 0  # (malformed: the message's handler refuses what else is wrong with it)
        if not (self._merge_max and type(message) in EXECUTES and self._run_merged(peers, peer, message, frames)):
            self._handle_one(peers, peer, message, frames)
        if poll_us and not self._merge_busy():
            peers.poll_next(poll_us)

    def _handle_one(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> None:
        """A message handled alone, on this thread (an Execute of a merging model is timed for merged_serving)."""
        timed = self._merge_max and type(message) in EXECUTES
        if timed:
            t0, b0 = _now_ns(), busy_ns()
        if peer is not None:
            self._on_peer_message(peers, peer, message, frames)
        else:
            handler = self._handlers.get(type(message))
            if handler is None:
                raise ProtocolError("unexpected message type %s from the supervisor" % type(message).__name__)
            handler(message, frames)
        if timed:
            wall = _now_ns() - t0
            self._executed(wall, (peer,))
            self._merge_threaded = mostly_waits(wall, busy_ns() - b0)

    def _on_peer_message(self, peers: DirectPeers, peer: DirectPeer, message: Any, frames: Sequence[Any]) -> None:
        """A direct peer's message, handled with that peer as the origin; whatever goes wrong drops the peer."""
        kind = type(message)
        if kind not in PEER_MESSAGES:
            peers.drop(peer, "a direct peer may not send %s" % kind.__name__, True)
            return
        try:
            if kind is ReleaseOutputs:
                peers.release(peer, message.regions)
            elif kind is Cancel and not valid_ids(message.request_ids):
                raise ProtocolError("malformed cancel message")
            elif self._outbox is not None:  # decoupled: its streams go to the supervisor only
                if kind is not Cancel:  # (a Cancel names nothing of this peer's: none of its requests runs)
                    self._refuse_decoupled(peer, message)
            else:
                self._handle_as(peer, message, frames)
        except Exception as exc:  # a malformed message (a bug of ours too): that peer goes, the worker stays
            peers.drop(peer, "%s: %s" % (type(exc).__name__, exc), True)
            return
        if peer.lost is not None:
            peers.drop(peer, "its reply could not be sent: %s" % peer.lost, False)

    def _handle_as(self, peer: DirectPeer, message: Any, frames: Sequence[Any]) -> None:
        """Run the handler with `peer` as the origin: its Cancels, its socket for the reply, and the output
        regions the reply hands out noted as the peer's. Device outputs are not offered to a peer."""
        if type(message) is Execute:
            for item in message.requests:
                item.device_outputs = False
        results = self._results
        handed: list[str] = []
        self._cancelled, self._reply, results.handed = peer.cancelled, peer, handed
        try:
            self._handlers[type(message)](message, frames)
        finally:
            self._cancelled, self._reply, results.handed = self._main_cancelled, self._channel, None
            peer.regions.update(handed)

    def _refuse_decoupled(self, peer: DirectPeer, message: Any) -> None:
        requests = message.requests if type(message) is Execute else None
        ids = [item.request_id for item in requests] if requests is not None else list(message.request_ids)
        error = WireError(int(ErrorCode.UNAVAILABLE), "model '%s' is decoupled: decoupled models are not served "
                          "over a direct link" % (self._spec.model_name if self._spec else ""))
        peer.send_encoded(self._results.failed_batch(message.batch_id, ids, error))

    def _on_attach(self, message: Attach, frames: Sequence[Any]) -> None:
        """Connect to a frontend's socket as a direct peer (direct_peers.py); a failure is only logged."""
        if type(message.endpoint) is not str:
            raise ProtocolError("malformed attach message")
        if self._peers is None:
            if not isinstance(getattr(self._channel, "identity", None), str):
                self._log("direct peer %s refused: this worker's channel cannot open more sockets"
                          % message.endpoint)
                return
            self._peers = DirectPeers(self._channel, self._log, lambda regions: self._results.release(regions, []))
            if self._outbox is not None:
                self._peers.watch(self._outbox.fileno(), self._flush_outbox)
        self._peers.attach(message.endpoint)
        if len(self._peers):
            self._single = False  # run() switches to the loop over every socket

    def _flush_outbox(self) -> None:
        if self._outbox is not None:
            self._outbox.flush(self._channel)
