"""Batches of several senders run as one execute(): a dynamic-batching model with direct peers (a mixin of
message_loop.Runtime beside direct_serving.py; docs/worker-protocol.md "Direct peers").

Each frontend forms batches from its own requests and sends them straight to the worker; the worker merges the
Executes waiting on its sockets, up to max_batch_size, into one execute() and answers each sender on its own
socket (`_run_merged`).

An execute that mostly waits (a sleep, I/O, a device, a remote call: its thread on a CPU or waiting for one for
under half its wall time, and at least PIPELINE_MIN_NS long) runs on the merge thread instead of the main
thread. The main thread meanwhile keeps the sockets (Cancels, releases), holds back the Executes that arrive
(`_deferred`), and when the execute ends starts the next merged batch from them before it writes the answers of
the one just done. The answers (one per sender, each encoded and sent) then overlap the next execute instead of
standing between two. An execute that keeps its thread busy stays on the main thread: the two threads would
only share the interpreter. Control messages from the core (a Shutdown, a load) first wait for what runs and
what was held.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from .backends.base import Request, Response
from .channel import Channel
from .direct_peers import DirectPeer, DirectPeers
from .result_writer import ResultWriter
from .thread_busy import busy_ns
from .wire.errors import ErrorCode
from .wire.messages import Execute, ExecuteColumns, WireError

EXECUTES = frozenset((Execute, ExecuteColumns))
_CANCELLED = WireError(code=int(ErrorCode.CANCELLED), message="request cancelled")
_now_ns = time.perf_counter_ns

GATHER_MIN_NS = 1_000_000  # an execute at least this long lets the next merged one wait for more batches (_executed)
GATHER_SHARE = 4  # for at most this fraction of it
GATHER_MAX_NS = 2_000_000  # and never longer than this
# an execute this long, whose thread was busy (busy_ns) for under half of it, sends the next ones to the merge thread
PIPELINE_MIN_NS = 1_000_000


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


def _items(request: Request) -> int:
    """A request's batch items: its first input's first dimension."""
    try:
        shape = request.inputs[0].array.shape
    except (AttributeError, IndexError):
        return 1
    return int(shape[0]) if shape else 1


def _nothing() -> None:
    return None


def mostly_waits(wall_ns: int, busy: int) -> bool:
    """Whether an execute of this wall time, its thread busy (thread_busy.busy_ns) for `busy` of it, runs on
    the merge thread next time (see the module docstring)."""
    return wall_ns >= PIPELINE_MIN_NS and 2 * busy <= wall_ns


Part = tuple[Optional[DirectPeer], tuple[Any, ...]]  # a sender (None: the core) and its decoded batch


class Job(NamedTuple):
    """A merged batch running on the merge thread."""
    parts: list[Part]
    runnable: list[Request]
    future: Future  # -> (results, t1, t2, busy ns)


def prune(cancelled: set[int], last_request_id: Optional[int]) -> None:
    """After a batch is answered: ids grow per sender (each has its own set), so later batches' Cancels (read
    ahead while this one ran) are kept; in place, the set is the sender's."""
    if cancelled and last_request_id is not None:
        cancelled.difference_update([rid for rid in cancelled if rid <= last_request_id])


class MergedServing:
    """Runtime's merging of batches (see the module docstring)."""

    # Runtime's state this half uses (set by Runtime.__init__ and its handlers)
    _handlers: dict[type[Any], Callable[[Any, Sequence[Any]], None]]
    _results: ResultWriter
    _channel: Channel
    _cancelled: set[int]
    _main_cancelled: set[int]
    _is_cancelled: Callable[[int], bool]
    _main_thread: threading.Thread
    _merge_max: int
    _gather_ns: int
    _last_senders: frozenset[int]
    _flush_metrics: Callable[[], None]
    # the merge thread's (made at its first use)
    _merge_pool: Optional[ThreadPoolExecutor]
    _merge_job: Optional[Job]
    _merge_threaded: bool  # the next merged batch runs on the merge thread
    _merge_draining: bool
    _merge_wake: tuple[int, int]  # (read, write) ends of the pipe the merge thread signals an end through
    _deferred: collections.deque[tuple[Optional[DirectPeer], Any, Sequence[Any]]]
    _next: list[tuple[Part, int]]
    _next_total: int

    def is_cancelled(self, request_id: int) -> bool:
        raise NotImplementedError

    def poll_cancellations(self) -> None:
        raise NotImplementedError

    def _run_backend(self, requests: list[Request]) -> Sequence[Response]:
        raise NotImplementedError

    def _run_entries(self, batch_id: int, entries: list[Any], runnable: list[Request], t0: int,
                     last_request_id: Optional[int]) -> None:
        raise NotImplementedError

    def _execute_thread_start(self) -> None:
        raise NotImplementedError

    def _init_merged(self) -> None:
        self._merge_max = 0  # > 0: with peers, batches queued from several senders run as one, up to this size
        self._gather_ns = 0  # how long the next merged execute may wait for more batches (_executed)
        self._last_senders = frozenset()
        self._merge_pool = None
        self._merge_job = None
        self._merge_threaded = False
        self._merge_draining = False  # everything runs on the main thread (_drain_merged)
        self._merge_wake = (-1, -1)
        self._deferred = collections.deque()
        # decoded for the batch after the merge thread's (see _defer), each with how long its decoding took
        self._next: list[tuple[Part, int]] = []
        self._next_total = 0  # its batch size
        self._main_probe: Optional[Callable[[int], bool]] = None  # is_cancelled of the core's requests, off main

    # ---- the loop's side ----
    def _merge_busy(self) -> bool:
        """An execute runs on the merge thread (the Executes that come meanwhile are deferred)."""
        return self._merge_job is not None

    def _merge_done(self) -> bool:
        job = self._merge_job
        return job is not None and job.future.done()

    def _defer(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> None:
        """An Execute that came while the merge thread runs: held back as it came, then decoded into the next
        batch while it fits there (so that batch starts as soon as this one ends)."""
        self._deferred.append((peer, message, frames))
        self._predecode(peers)

    def _predecode(self, peers: DirectPeers) -> None:
        deferred, limit = self._deferred, self._merge_max
        while deferred:
            peer, message, frames = deferred[0]
            size = batch_size(message)
            if size is None or self._next_total + size > limit:
                return  # (the rest keep their order behind it)
            deferred.popleft()
            began = _now_ns()
            part = self._part(peers, peer, message, frames)
            if part is not None:
                self._next.append((part, _now_ns() - began))
                self._next_total += size

    def _merged_ended(self, peers: DirectPeers) -> None:
        """The merge thread's batch is done: the next one starts (when it goes to the thread too), then the
        answers of this one go."""
        try:
            while os.read(self._merge_wake[0], 64):
                pass
        except (BlockingIOError, OSError):
            pass
        job = self._merge_job
        if job is None:
            return
        self._merge_job = None
        results, t1, t2, busy = job.future.result()
        self._merge_threaded = mostly_waits(t2 - t1, busy)
        decoded, self._next, self._next_total = self._next, [], 0
        now = _now_ns()
        # the Cancels read since they were decoded; compute_input as if decoded now (not the wait for a turn)
        ready = [self._without_cancelled(self._decoded_at(part, now - ns)) for part, ns in decoded]
        if self._merge_threaded and not self._merge_draining:
            if ready:
                self._launch(peers, ready)
                self._predecode(peers)
            else:
                self._start_deferred(peers)
            self._answer(peers, job.parts, job.runnable, results, t1, t2)
        else:  # the next ones run here: these answers do not wait for them
            self._answer(peers, job.parts, job.runnable, results, t1, t2)
            if ready:
                self._launch(peers, ready)
            self._start_deferred(peers)

    def _start_deferred(self, peers: DirectPeers) -> None:
        """Run what was held back, oldest first, until one batch is on the merge thread or none is left."""
        deferred = self._deferred
        while deferred and self._merge_job is None:
            peer, message, frames = deferred.popleft()
            if peer is not None and not peers.attached(peer):
                continue  # dropped meanwhile: nothing of it is answered
            if not self._run_merged(peers, peer, message, frames):
                self._handle_one(peers, peer, message, frames)
        self._predecode(peers)

    def _drain_merged(self, peers: DirectPeers) -> None:
        """Wait for the merge thread's batch and run everything held back on this thread (before a control
        message, and when the direct loop ends)."""
        self._merge_draining = True
        try:
            job = self._merge_job
            if job is not None:
                job.future.result()
                self._merged_ended(peers)
            self._start_deferred(peers)
        finally:
            self._merge_draining = False

    if TYPE_CHECKING:  # direct_serving.DirectServing's (declared only: a stub here would hide it)
        def _handle_one(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any,
                        frames: Sequence[Any]) -> None:
            raise NotImplementedError

    # ---- one merged batch ----
    def _executed(self, ns: int, senders: Sequence[Optional[DirectPeer]]) -> None:
        """After an execute of a merging model: how long the next one may wait for more batches (`_gather_ns`).
        Only while batches come from more than one sender (they alternate, or met in this one) and an execute
        takes a while: then the senders just answered send their next batches within a fraction of it, and
        waiting for them forms the batch one batcher would have formed. A lone sender never waits."""
        ids = frozenset(id(s) for s in senders)
        several = len(ids) > 1 or ids != self._last_senders
        self._last_senders = ids
        self._gather_ns = min(ns // GATHER_SHARE, GATHER_MAX_NS) if several and ns >= GATHER_MIN_NS else 0

    def _run_merged(self, peers: DirectPeers, peer: Optional[DirectPeer], message: Any, frames: Sequence[Any]) -> bool:
        """Run `message` (an Execute of the main socket or of `peer`) together with the Executes held back and
        queued behind it on every socket, as one execute() of at most max_batch_size; each sender gets its own
        reply. False when it is left to the caller to handle alone (it cannot be merged, or nothing came to
        merge with it and it runs on this thread)."""
        limit = self._merge_max
        size = batch_size(message)
        threaded = self._merge_threaded and not self._merge_draining
        if size is None or (size >= limit and not threaded):
            return False
        total = [size]

        def fits(queued: Any) -> bool:
            n = batch_size(queued) if type(queued) in EXECUTES else None
            if n is None or total[0] + n > limit:
                return False
            total[0] += n
            return True

        more = []
        deferred = self._deferred
        while deferred and fits(deferred[0][1]):  # the older ones first; the queued ones only behind all of them
            more.append(deferred.popleft())
        if not deferred:
            more += peers.take_queued(fits)
            if self._gather_ns and total[0] < limit and not threaded:  # (see _executed) the senders are on their way
                deadline = _now_ns() + self._gather_ns
                while total[0] < limit:
                    left = deadline - _now_ns()
                    if left <= 0:
                        break
                    peers.wait(max(1, left // 1_000_000))
                    more += peers.take_queued(fits)
        if not more and not threaded:
            return False
        parts = [part for part in (self._part(peers, origin, queued, queued_frames)
                                   for origin, queued, queued_frames in [(peer, message, frames), *more])
                 if part is not None]
        self._launch(peers, parts)
        return True

    def _part(self, peers: DirectPeers, origin: Optional[DirectPeer], message: Any,
              frames: Sequence[Any]) -> Optional[Part]:
        """A sender's Execute decoded for a merged batch; None when that peer is gone (or goes now: its message
        is malformed; the core's raises)."""
        if origin is None:
            return None, self._collect(None, message, frames)
        if not peers.attached(origin):
            return None
        try:
            return origin, self._collect(origin, message, frames)
        except Exception as exc:  # a malformed message: that peer goes (its other batches here are answered)
            peers.drop(origin, "%s: %s" % (type(exc).__name__, exc), True)
            return None

    @staticmethod
    def _decoded_at(part: Part, t0: int) -> Part:
        origin, (batch_id, entries, mine, _, last) = part
        return origin, (batch_id, entries, mine, t0, last)

    def _without_cancelled(self, part: Part) -> Part:
        """A decoded part with the requests its sender cancelled since then answered as cancelled, not run."""
        origin, (batch_id, entries, mine, t0, last) = part
        cancelled = origin.cancelled if origin is not None else self._main_cancelled
        if not cancelled or not any(r.request_id in cancelled for r in mine):
            return part
        entries = [(e.request_id, _CANCELLED) if type(e) is not tuple and e.request_id in cancelled else e
                   for e in entries]
        mine = [r for r in mine if r.request_id not in cancelled]
        return origin, (batch_id, entries, mine, t0, last)

    def _launch(self, peers: DirectPeers, parts: list[Part]) -> None:
        """Run a merged batch: on the merge thread, or here and answered at once."""
        if not parts:
            return
        runnable = [r for _, part in parts for r in part[2]]
        if self._merge_threaded and not self._merge_draining:
            self._submit(peers, parts, runnable)
            return
        t1, b1 = _now_ns(), busy_ns()
        results = self._run_backend(runnable)
        t2 = _now_ns()
        self._merge_threaded = mostly_waits(t2 - t1, busy_ns() - b1)
        self._answer(peers, parts, runnable, results, t1, t2)

    def _submit(self, peers: DirectPeers, parts: list[Part], runnable: list[Request]) -> None:
        """Run the batch on the merge thread; its end wakes the loop (next_message) through the pipe."""
        if self._merge_pool is None:
            self._merge_wake = os.pipe()
            os.set_blocking(self._merge_wake[0], False)
            self._merge_pool = ThreadPoolExecutor(1, thread_name_prefix="inferd-merge",
                                                  initializer=self._execute_thread_start)
            peers.watch(self._merge_wake[0], _nothing)
        future = self._merge_pool.submit(self._run_off_main, runnable)
        self._merge_job = Job(parts, runnable, future)
        future.add_done_callback(self._signal_end)  # (after the future is done: the loop finds it so)

    def _signal_end(self, _future: Future) -> None:
        try:
            os.write(self._merge_wake[1], b"\0")
        except OSError:
            pass  # the pipe is full: a wake-up is pending anyway

    def _run_off_main(self, runnable: list[Request]) -> tuple[Sequence[Response], int, int, int]:
        """The merge thread: run the batch (a failure is answered as the batch's error: it never raises)."""
        t1, b1 = _now_ns(), busy_ns()
        results = self._run_backend(runnable)
        return results, t1, _now_ns(), busy_ns() - b1

    def _answer(self, peers: DirectPeers, parts: list[Part], runnable: list[Request], results: Sequence[Response],
                t1: int, t2: int) -> None:
        """Each sender's reply to its part of a merged execute."""
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
        else:  # (is_cancelled reads whichever sender's set is being decoded for: the merge thread may ask)
            if self._main_probe is None:
                self._main_probe = self._peer_probe(self._main_cancelled)
            self._is_cancelled = self._main_probe
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

    def _stop_merging(self) -> None:
        """At Shutdown, after the drain: the merge thread ends."""
        if self._merge_pool is not None:
            self._merge_pool.shutdown(wait=True)
            self._merge_pool = None
            for fd in self._merge_wake:
                os.close(fd)
            self._merge_wake = (-1, -1)
