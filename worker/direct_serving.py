"""The message loop's serving of direct peers (a mixin of message_loop.Runtime; the peers themselves:
direct_peers.py; docs/worker-protocol.md "Direct peers").

With peers attached the loop reads every socket (`_run_direct`); a peer's message is handled with that peer as
its origin: its Cancels, its socket for the reply, the output regions handed to it (`_handle_as`). For a
dynamic-batching model the Executes already waiting on every socket run as one execute() (`_run_merged`), each
sender answered on its own socket. Kept apart from message_loop.py so that the main socket's loop stays what it
was; the attributes below are Runtime's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from .backends.base import ModelSpec, Request, Response
from .channel import Channel, Outbox
from .direct_peers import PEER_MESSAGES, DirectPeer, DirectPeers, valid_ids
from .result_writer import ResultWriter
from .wire.errors import ErrorCode
from .wire.messages import Attach, Cancel, Execute, ExecuteColumns, ProtocolError, ReleaseOutputs, WireError

EXECUTES = frozenset((Execute, ExecuteColumns))
_now_ns = time.perf_counter_ns


GATHER_MIN_NS = 1_000_000  # an execute at least this long lets the next merged one wait for more batches (_executed)
GATHER_SHARE = 4  # for at most this fraction of it
GATHER_MAX_NS = 2_000_000  # and never longer than this


def prune(cancelled: set[int], last_request_id: Optional[int]) -> None:
    """After a batch is answered: ids grow per sender (each has its own set), so later batches' Cancels (read
    ahead while this one ran) are kept; in place, the set is the sender's."""
    if cancelled and last_request_id is not None:
        cancelled.difference_update([rid for rid in cancelled if rid <= last_request_id])


def batch_size(message: Any) -> Optional[int]:
    """The batch size an Execute / ExecuteColumns asks of a batching model (the first dimension of each
    request's first input, summed), or None when that cannot be told (then it is not merged)."""
    try:
        if type(message) is Execute:
            total = 0
            for item in message.requests:
                n = item.inputs[0].shape[0] if item.inputs and item.inputs[0].shape else 1
                if type(n) is not int or n < 0:
                    return None
                total += n
            return total
        n = message.inputs[0].shape[0] if message.inputs and message.inputs[0].shape else 1
        count = message.request_ids
        return n * len(count) if type(n) is int and n >= 0 and type(count) is list else None
    except (AttributeError, IndexError, TypeError):
        return None


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


def _items(request: Request) -> int:
    """A request's batch items: its first input's first dimension."""
    try:
        shape = request.inputs[0].array.shape
    except (AttributeError, IndexError):
        return 1
    return int(shape[0]) if shape else 1


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
    _polls: bool
    _gather_ns: int
    _last_senders: frozenset[int]
    _running: bool
    _single: bool
    _main_thread: threading.Thread
    _log: Callable[[str], None]
    _flush_metrics: Callable[[], None]

    def is_cancelled(self, request_id: int) -> bool:
        raise NotImplementedError

    def poll_cancellations(self) -> None:
        raise NotImplementedError

    def _run_backend(self, requests: list[Request]) -> Sequence[Response]:
        raise NotImplementedError

    def _run_entries(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int,
                     last_request_id: Optional[int]) -> None:
        raise NotImplementedError

    def _run_direct(self, peers: DirectPeers) -> None:
        """The main socket and every direct peer's: until Shutdown or no peer is left. An Execute's poll_us has the
        wait for the next message poll every socket first, as the single socket's loop does."""
        handlers = self._handlers
        while self._running and len(peers):
            got = peers.next_message()
            if got is None:
                continue
            peer, message, frames = got
            # once answered, its sender expects the next one soon (it polls too): see _run_single
            poll_us = message.poll_us if type(message) in EXECUTES and self._polls and self._outbox is None else 0
            if type(poll_us) is not int or poll_us < 0:
                poll_us = 0  # (malformed: the message's handler refuses what else is wrong with it)
            merging = self._merge_max and type(message) in EXECUTES
            if not (merging and self._run_merged(peers, peer, message, frames)):
                timed = _now_ns() if merging else 0
                if peer is not None:
                    self._on_peer_message(peers, peer, message, frames)
                else:
                    handler = handlers.get(type(message))
                    if handler is None:
                        raise ProtocolError("unexpected message type %s from the supervisor" % type(message).__name__)
                    handler(message, frames)
                if timed:
                    self._executed(_now_ns() - timed, (peer,))
            if poll_us:
                peers.poll_next(poll_us)

    def _executed(self, ns: int, senders: Sequence[Optional[DirectPeer]]) -> None:
        """After an execute of a merging model: how long the next one may wait for more batches (`_gather_ns`).
        Only while batches come from more than one sender (they alternate, or met in this one) and an execute
        takes a while: then the senders just answered send their next batches within a fraction of it, and
        waiting for them forms the batch one batcher would have formed. A lone sender never waits."""
        ids = frozenset(id(s) for s in senders)
        several = len(ids) > 1 or ids != self._last_senders
        self._last_senders = ids
        self._gather_ns = min(ns // GATHER_SHARE, GATHER_MAX_NS) if several and ns >= GATHER_MIN_NS else 0

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

    # ---- batches of several senders run as one (dynamic batching, with direct peers) ----------------

    def _run_merged(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> bool:
        """Run `message` (an Execute of the main socket or of `peer`) together with the Executes already queued
        behind it on every socket, as one execute() of at most max_batch_size; each sender gets its own reply.
        Each frontend forms its batches from its own requests: this merges them where they meet. False when
        nothing could be merged (the caller handles `message` alone)."""
        limit = self._merge_max
        size = batch_size(message)
        if size is None or size >= limit:
            return False
        total = [size]

        def fits(queued: Any) -> bool:
            n = batch_size(queued) if type(queued) in EXECUTES else None
            if n is None or total[0] + n > limit:
                return False
            total[0] += n
            return True

        more = peers.take_queued(fits)
        if self._gather_ns and total[0] < limit:  # (see _executed) the senders just answered are on their way
            deadline = _now_ns() + self._gather_ns
            while total[0] < limit:
                left = deadline - _now_ns()
                if left <= 0:
                    break
                peers.wait(max(1, left // 1_000_000))
                more += peers.take_queued(fits)
        if not more:
            return False
        parts: list[tuple[Optional[DirectPeer], tuple[Any, ...]]] = []
        for origin, queued, queued_frames in [(peer, message, frames), *more]:
            if origin is None:
                parts.append((None, self._collect(None, queued, queued_frames)))
                continue
            try:
                parts.append((origin, self._collect(origin, queued, queued_frames)))
            except Exception as exc:  # a malformed message: that peer goes (its other batches here are answered)
                peers.drop(origin, "%s: %s" % (type(exc).__name__, exc), True)
        runnable = [r for _, part in parts for r in part[2]]
        t1 = _now_ns()
        results = self._run_backend(runnable)
        t2 = _now_ns()
        self._executed(t2 - t1, [origin for origin, _ in parts])
        self._flush_metrics()
        start = 0
        writer = self._results
        counted = False  # the first reply counts the execution (ExecuteResult.merged); the others say so
        executed = sum(_items(r) for r in runnable)  # (the cancelled requests left out)
        for origin, (batch_id, entries, mine, t0, last) in parts:
            answers = results[start:start + len(mine)]
            start += len(mine)
            mark = b',"merged":-1}' if counted else b',"merged":%d}' % executed
            counted = True
            if origin is None:
                header, out_frames = writer.batch(batch_id, entries, mine, answers, (t0, t1, t2))
                header = header[:-1] + mark
                self._channel.send_encoded(header, out_frames)
                prune(self._main_cancelled, last)
                continue
            handed: list[str] = []
            writer.handed = handed
            try:
                header, out_frames = writer.batch(batch_id, entries, mine, answers, (t0, t1, t2))
                header = header[:-1] + mark  # (a JSON object's text: one member more before its end)
            finally:
                writer.handed = None
            if not peers.attached(origin):  # dropped meanwhile: its reply goes nowhere, its regions come back
                if handed:
                    writer.release(handed, [])
                continue
            origin.regions.update(handed)
            origin.send_encoded(header, out_frames)
            prune(origin.cancelled, last)
            if origin.lost is not None:
                peers.drop(origin, "its reply could not be sent: %s" % origin.lost, False)
        return True

    def _collect(self, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> tuple[Any, ...]:
        """(batch_id, entries, runnable, t0, last request id) of an Execute / ExecuteColumns, decoded by its
        handler as if it were to run (cancelled requests left out, with `peer`'s Cancels and probe) but not run."""
        got: list[tuple[Any, ...]] = []

        def keep(batch_id: int, entries: list[Any], runnable: list[Request], t0: int, last: Optional[int]) -> None:
            got.append((batch_id, entries, runnable, t0, last))

        self._run_entries = keep  # type: ignore[method-assign,assignment]  # (shadows the method while the handler decodes)
        if peer is not None:
            if type(message) is Execute:
                for item in message.requests:
                    item.device_outputs = False
            if peer.probe is None:
                peer.probe = self._peer_probe(peer.cancelled)
            self._cancelled, self._is_cancelled = peer.cancelled, peer.probe
        try:
            self._handlers[type(message)](message, frames)
        finally:
            del self._run_entries
            self._cancelled, self._is_cancelled = self._main_cancelled, self.is_cancelled
        return got[0]

    def _peer_probe(self, cancelled: set[int]) -> Callable[[int], bool]:
        """is_cancelled for one peer's requests (they may share a batch with other senders' requests)."""
        main, poll = self._main_thread, self.poll_cancellations

        def probe(request_id: int) -> bool:
            if threading.current_thread() is main:
                poll()
            return request_id in cancelled
        return probe

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
