"""The batches in flight on one worker process.

Up to `depth` Executes are sent ahead, so the worker starts the next one without waiting for a round
trip (it still runs them one at a time, in order); callers beyond that wait here, first come first
served, for a slot. Each ExecuteResult is matched to its batch, whose leases are released and whose
future is resolved; decoupled requests stay open past it in streams.py. worker.py owns the process and
its protocol and feeds this its results; a death fails everything here at once (`fail_all`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from inferd.supervisor.inference.types import InferRequest
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from . import poll_hint, results
from .outputs import WorkerOutputs
from .packing import InputPacker, release_leases
from .results import BatchResult
from .streams import OpenStreams

log = logging.getLogger("inferd.instances.worker")


class BatchFuture(asyncio.Future[BatchResult]):
    """A batch's future. `eager`: one of its done-callbacks (also added with add_done_callback) that the
    pipeline runs itself when it reads the batch's answer, instead of leaving it to the loop's next pass
    (at concurrency 1 that pass is a loop iteration per request); any other outcome runs it as usual."""

    __slots__ = ("eager",)
    eager: Callable[[Any], None] | None


class _Batch:
    __slots__ = ("batch_id", "fut", "requests", "ids", "leases", "on_settled", "on_free", "done_cb")

    def __init__(self, batch_id: int, fut: asyncio.Future[BatchResult], requests: Sequence[InferRequest],
                 ids: list[int], leases: list[Any], on_settled: Callable[[int], None] | None,
                 on_free: Callable[[], None] | None = None) -> None:
        self.batch_id = batch_id
        self.fut = fut
        self.requests = requests
        self.ids = ids
        self.leases = leases
        self.on_settled = on_settled  # the instance's in-flight count: run once the future is done
        self.on_free = on_free  # the scheduler's: told as the result arrives, before it is read
        self.done_cb: Callable[[asyncio.Future[BatchResult]], None] | None = None  # see _send_batch


class BatchPipeline:
    def __init__(self, *, depth: int, packer: InputPacker, outputs: WorkerOutputs, model_version: str,
                 send: Callable[[list[Any], bool], None], send_quiet: Callable[[Any], None],
                 kill: Callable[[str], None], refusal: Callable[[], InferdError | None],
                 who: Callable[[], str]) -> None:
        self.depth = max(1, depth)
        self.packer = packer
        self._outputs = outputs
        self._model_version = model_version
        # the frames of one message to the worker, and whether it may wait for the end of this loop pass
        # (raises InferdError when unreachable)
        self._send = send
        self._send_quiet = send_quiet  # one message, dropped when the worker is unreachable
        self._kill = kill
        self._refusal = refusal  # why the worker takes no batch now, or None while it is ready
        self._who = who
        self._loop = asyncio.get_running_loop()
        self._batches: dict[int, _Batch] = {}
        self.streams = OpenStreams(lambda rid: send_quiet(m.Cancel([rid])), kill)
        self._slots = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._batch_ids = itertools.count(1)

    @property
    def busy(self) -> bool:
        return self._slots >= self.depth

    @property
    def inflight(self) -> int:
        return sum(len(b.requests) for b in self._batches.values())

    @property
    def held(self) -> int:
        """Batches sent or waiting here for a slot, and decoupled streams still open: 0 when nothing is left
        for this worker to answer (a replaced worker is stopped then)."""
        # (_slots counts a slot handed to a waiter that has not sent its batch yet)
        return max(self._slots, len(self._batches)) + len(self._waiters) + len(self.streams)

    async def execute(self, requests: Sequence[InferRequest]) -> BatchResult:
        """Run one batch, waiting for a slot when `depth` are in flight."""
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        if self._slots >= self.depth:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release_slot()  # ownership was handed over just before the cancel
                raise
            refusal = self._refusal()
            if refusal is not None:
                self._release_slot()
                raise refusal
        else:
            self._slots += 1
        return await self._send_batch(requests)

    def launch(self, requests: Sequence[InferRequest],
               on_settled: Callable[[int], None] | None = None,
               on_free: Callable[[], None] | None = None) -> asyncio.Future[BatchResult]:
        """`execute` without a coroutine while a slot is free; with every slot taken it waits in `execute`
        (and `on_free` is not called). `on_settled(len(requests))` runs once the returned future is done
        (from the callback this pipeline runs anyway: one loop callback less per batch than a done callback
        of its own). `on_free()` runs as the result arrives, before it is read: the scheduler's next batch
        leaves while this one's answers are still to be split."""
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        if self._slots >= self.depth:
            task = asyncio.ensure_future(self.execute(requests))
            if on_settled is not None:
                count = len(requests)
                task.add_done_callback(lambda _: on_settled(count))
            return task
        self._slots += 1
        return self._send_batch(requests, on_settled, on_free)

    def _send_batch(self, requests: Sequence[InferRequest], on_settled: Callable[[int], None] | None = None,
                    on_free: Callable[[], None] | None = None) -> asyncio.Future[BatchResult]:
        """Pack and send one Execute; the caller holds a slot, which the reply frees."""
        try:
            batch_id = next(self._batch_ids)
            packed = self.packer.pack(requests)
        except BaseException:
            self._release_slot()
            raise
        leases, streams = packed.leases, packed.streams
        # with batches in flight the worker has work queued (or answers waiting to be read): this one is
        # written with the pass's others; to an idle worker it goes at once
        hold = bool(self._batches)
        fut = BatchFuture(loop=self._loop)
        fut.eager = None
        batch = _Batch(batch_id, fut, requests, packed.ids, leases, on_settled, on_free)
        self._batches[batch_id] = batch
        if streams:
            self.streams.add(streams)
        try:
            self._send([packed.header(batch_id, poll_hint.poll_us()), *packed.frames], hold)
        except InferdError as exc:
            self._batches.pop(batch_id, None)
            release_leases(leases)
            self.streams.end_all(streams)
            self._release_slot()
            # (the link names only the worker's socket: a worker that died a moment ago, before its instance knew)
            raise InferdError(exc.code, f"{self._who()}: {exc.message}") from None
        if streams:
            self.streams.attach(streams)
        # for a future settled elsewhere (the caller's cancel, fail_all); on_result settles its own and
        # takes this back first: one loop callback less per batch
        batch.done_cb = functools.partial(self._batch_settled, batch)
        fut.add_done_callback(batch.done_cb)
        return fut

    def _batch_settled(self, batch: _Batch, fut: asyncio.Future[BatchResult]) -> None:
        batch.done_cb = None  # (the cycle through the partial)
        # the caller gave up (cancelling the future): tell the worker, whose reply still frees the slot
        if fut.cancelled() and self._batches.get(batch.batch_id) is batch:
            self._send_quiet(m.Cancel(list(batch.ids)))
        if batch.on_settled is not None:
            batch.on_settled(len(batch.requests))

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        """Tell the worker that these requests (of the batches in flight, or streaming) are cancelled."""
        wanted = {id(r) for r in requests}
        ids = [rid for batch in self._batches.values()
               for req, rid in zip(batch.requests, batch.ids, strict=False) if id(req) in wanted]
        if self.streams.by_id:
            ids.extend(self.streams.ids_of(wanted, ids))
        if ids:
            self._send_quiet(m.Cancel(ids))

    def on_result(self, msg: m.ExecuteResult | m.ExecuteResultColumns | results.PlainResult,
                  data: Sequence[Any]) -> None:
        """An ExecuteResult: its batch resolved, its slot freed."""
        batch_id = msg.batch_id
        batch = self._batches.pop(batch_id, None) if type(batch_id) is int else None
        if batch is None:
            log.warning("%s: unexpected result for batch %r", self._who(), batch_id)
            return
        if batch.leases:
            release_leases(batch.leases)
        if batch.on_free is not None and not batch.fut.done():
            try:
                batch.on_free()  # the next batch may leave now, before this one is read
            except Exception:  # a scheduler bug: this batch is still answered
                log.exception("%s: the scheduler failed on a freed slot", self._who())
        try:
            result = results.batch_result(batch.requests, batch.ids, msg, data, self._model_version, self._outputs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            result = None
            self._kill(f"sent a malformed result ({exc!r})")
            if not batch.fut.done():
                batch.fut.set_exception(
                    InferdError(ErrorCode.INTERNAL, f"{self._who()} sent a malformed result"))
        settled = eager = None
        if result is not None:
            if self.streams.by_id:
                self.streams.end_failed(batch.ids, result.responses)
            fut = batch.fut
            if not fut.done():
                if batch.done_cb is not None:
                    # settled here, so on_settled runs here (after the slot is freed, as it did from the
                    # future's callback): no loop callback of ours per batch
                    fut.remove_done_callback(batch.done_cb)
                    batch.done_cb = None  # no batch -> partial -> batch cycle left for the GC
                    settled = batch.on_settled
                eager = fut.eager  # type: ignore[attr-defined]  # (a BatchFuture)
                if eager is not None:  # taken back before set_result schedules it
                    fut.eager = None  # type: ignore[attr-defined]
                    fut.remove_done_callback(eager)
                fut.set_result(result)
        if self._waiters:
            self._release_slot()
        elif self._slots > 0:  # (_release_slot with nobody waiting)
            self._slots -= 1
        if settled is not None:
            settled(len(batch.requests))
        if eager is not None:  # last, as the loop would run it: the slot is free, the instance told
            try:
                eager(fut)
            except Exception:  # (as the loop logs a failed callback)
                log.exception("%s: a batch's done-callback failed", self._who())

    def on_stream_response(self, msg: m.StreamResponse, data: Sequence[Any]) -> None:
        self.streams.on_response(msg, data, self._model_version, self._outputs)

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over: the count stays
                return
        self._slots = max(0, self._slots - 1)

    def fail_all(self, err: InferdError) -> None:
        """The worker is gone: every batch and stream fails with `err`; waiters wake to the refusal."""
        batches, self._batches = self._batches, {}
        for batch in batches.values():
            release_leases(batch.leases)
            if not batch.fut.done():
                batch.fut.set_exception(err)
        self.streams.fail_all(err)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it re-checks the refusal and raises
        self._slots = 0
