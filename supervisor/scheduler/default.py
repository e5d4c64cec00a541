"""The default scheduler: a bounded per-model queue, served by runners, `pipeline_depth` per instance
(each holds one request in that instance's worker, so the worker always has the next one at hand).

A new request wakes a waiting runner of the instance that holds the fewest requests (the least-busy
ready instance), which runs it and resolves the request's future. Requests wait only while at least
one instance is ready; with none ready they fail at once with UNAVAILABLE, because readiness must tell
the truth. As in Triton, a request's `timeout` parameter does nothing here: queue timeouts need a
dynamic_batching queue policy.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..core.types import InferRequest, InferResponse
from .base import Executor
from .queue import WorkQueue

log = logging.getLogger("inferd.scheduler")


class Pending:
    __slots__ = ("request", "future", "executor")

    def __init__(self, request: InferRequest, future: asyncio.Future[InferResponse]) -> None:
        self.request = request
        self.future = future
        self.executor: Executor | None = None  # the instance running it, once dispatched


class StatsSink:
    """Receiver of per-request and per-batch figures (supervisor.stats.ModelStats fits)."""

    def record_success(self, batch_items: int, request_ns: int, queue_ns: int, compute_input_ns: int,
                       compute_infer_ns: int, compute_output_ns: int) -> None: ...

    def record_failure(self, reason: str, request_ns: int) -> None: ...

    def record_execution(self, batch_size: int, compute_input_ns: int, compute_infer_ns: int,
                         compute_output_ns: int) -> None: ...


class DefaultScheduler:
    def __init__(self, model_name: str, executors: Sequence[Executor], stats: StatsSink, max_queue_size: int,
                 max_batch_requests: int = 1, batched: bool = False, runners_per_instance: int = 1) -> None:
        self.model_name = model_name
        self.batched = batched  # max_batch_size > 0: dim 0 of the inputs counts batch items
        self.executors = executors
        self.stats = stats
        self.queue: WorkQueue[Pending] = WorkQueue(max_queue_size)
        self.max_batch_requests = max_batch_requests
        self.runners_per_instance = runners_per_instance
        # per instance, requests handed to it and not yet answered: new work goes to the least busy
        self._held = {id(e): 0 for e in executors}
        self._ready_events = {id(e): asyncio.Event() for e in executors}
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ----
    def start(self) -> None:
        """One runner per batch an instance may hold at once (its pipeline depth)."""
        for ex in self.executors:
            self.instance_changed(ex)
            for _ in range(max(1, self.runners_per_instance)):
                self._tasks.append(asyncio.create_task(self._runner(ex), name="runner-" + ex.name))

    def instance_changed(self, executor: Executor) -> None:
        """Called whenever an instance's readiness may have changed."""
        event = self._ready_events.get(id(executor))
        if event is None:
            return
        if executor.ready:
            event.set()
        else:
            event.clear()
            if not any(e.ready for e in self.executors):
                self._fail_queued(ErrorCode.UNAVAILABLE,
                                  "no ready instance of model '%s'" % self.model_name)

    @property
    def pending_count(self) -> int:
        return len(self.queue)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; wait (bounded) until queued and running ones are answered."""
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            self._fail_queued(ErrorCode.UNAVAILABLE, "model '%s' is unloading" % self.model_name)

    async def close(self) -> None:
        self._closed = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        self._fail_queued(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.model_name)

    # ---- request path ----
    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        if self._closed:
            raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' is not accepting requests" % self.model_name)
        for e in self.executors:
            if e.ready:
                break
        else:
            raise InferdError(ErrorCode.UNAVAILABLE,
                              "no ready instance of model '%s'" % self.model_name)
        queue = self.queue
        if queue.full():
            self.stats.record_failure("REJECTED", 0)
            raise InferdError(ErrorCode.UNAVAILABLE, "[request id: %s] Exceeds maximum queue size"  # as Triton
                              % (request.id or "<id_unknown>"))
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        item = Pending(request, loop.create_future())
        queue.put(item)
        item.future.add_done_callback(functools.partial(self._on_done, item))
        self._idle.clear()
        return item.future

    def _on_done(self, item: Pending, future: asyncio.Future[InferResponse]) -> None:
        """A cancelled request leaves the queue at once, or is cancelled in the worker running it."""
        if not future.cancelled():
            return
        if item.executor is not None:
            item.executor.cancel([item.request])
        elif self.queue.remove(item):
            self.stats.record_failure("CANCELED", time.monotonic_ns() - item.request.arrival_ns)
            self._check_idle()

    def _fail_queued(self, code: ErrorCode, message: str) -> None:
        for item in self.queue.drain():
            if not item.future.done():
                self.stats.record_failure("OTHER", time.monotonic_ns() - item.request.arrival_ns)
                item.future.set_exception(InferdError(code, message))
        self._check_idle()

    def _check_idle(self) -> None:
        if not len(self.queue) and not any(self._held.values()):
            self._idle.set()

    def _take_batch(self, executor: Executor) -> list[Pending]:
        batch: list[Pending] = []
        while len(batch) < self.max_batch_requests:
            item = self.queue.pop_nowait()
            if item is None:
                break
            if item.future.done():  # cancelled by the client while queued
                continue
            item.executor = executor
            batch.append(item)
        return batch

    async def _runner(self, executor: Executor) -> None:
        ready = self._ready_events[id(executor)]
        queue = self.queue
        key = id(executor)
        held = self._held

        def load() -> int:
            return held[key]

        balance = load if len(self.executors) > 1 else None  # one instance: plain FIFO wake-ups

        while True:
            if not ready.is_set():
                await ready.wait()
            if not len(queue):
                await queue.wait_nonempty(balance)
            if not executor.ready:
                continue
            batch = self._take_batch(executor)
            if not batch:
                self._check_idle()
                continue
            held[key] += len(batch)
            try:
                await self._execute(executor, batch)
            finally:
                held[key] -= len(batch)
                self._check_idle()

    def _items(self, request: InferRequest) -> int:
        if self.batched and request.inputs and request.inputs[0].shape:
            return max(1, request.inputs[0].shape[0])
        return 1

    async def _execute(self, executor: Executor, batch: list[Pending]) -> None:
        start = time.monotonic_ns()
        try:
            result = await executor.execute([p.request for p in batch])
        except InferdError as exc:
            responses: list[InferResponse | InferdError] = [exc] * len(batch)
            result = None
        except Exception as exc:  # a bug on our side: fail the batch, keep the runner alive
            log.exception("instance %s failed a batch", executor.name)
            responses = [InferdError(ErrorCode.INTERNAL, "internal error: %s" % exc)] * len(batch)
            result = None
        else:
            responses = result.responses
        end = time.monotonic_ns()
        items = sum(self._items(p.request) for p, r in zip(batch, responses) if not isinstance(r, InferdError))
        if result is not None and items:
            # as Triton: inference_count counts the batch items that succeeded
            self.stats.record_execution(items, result.compute_input_ns, result.compute_infer_ns,
                                        result.compute_output_ns)
        for item, response in zip(batch, responses):
            request_ns = end - item.request.arrival_ns
            if item.future.cancelled():  # the client gave up while it ran: its answer is dropped
                self.stats.record_failure("CANCELED", request_ns)
            elif isinstance(response, InferdError):
                reason = "CANCELED" if response.code == ErrorCode.CANCELLED else "BACKEND"
                self.stats.record_failure(reason, request_ns)
                if not item.future.done():
                    item.future.set_exception(response)
            else:
                if result is not None:
                    self.stats.record_success(1, request_ns, start - item.request.arrival_ns,
                                              result.compute_input_ns, result.compute_infer_ns,
                                              result.compute_output_ns)
                if not item.future.done():
                    item.future.set_result(response)
