"""The default scheduler: a bounded per-model queue feeding the instances, `pipeline_depth` requests
in flight per instance (so its worker always has the next one at hand).

Driven by callbacks, not runner tasks: a request that finds an instance with room is sent to it within
`submit`, and an answered request makes room for the next queued one within the completion callback,
so no event-loop pass is spent handing work between tasks. New work goes to the least-busy ready
instance. Requests wait only while at least one instance is ready; with none ready they fail at once
with UNAVAILABLE, because readiness must tell the truth. As in Triton, a request's `timeout` parameter
does nothing here: queue timeouts need a dynamic_batching queue policy.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest, InferResponse
from . import outcomes, shared
from .base import Executor
from .queue import WorkQueue
from .rate_gate import RateGate
from .shared import QueuedRequest, QueueLifecycle, queued

log = logging.getLogger("inferd.scheduler")


class StatsSink:
    """Receiver of per-request and per-batch figures (supervisor.metrics.model_statistics.ModelStats fits)."""

    def record_success(self, batch_items: int, request_ns: int, queue_ns: int, compute_input_ns: int,
                       compute_infer_ns: int, compute_output_ns: int) -> None: ...

    def record_successes(self, arrivals: Sequence[int], start_ns: int, end_ns: int, compute_input_ns: int,
                         compute_infer_ns: int, compute_output_ns: int) -> None: ...

    def record_failure(self, reason: str, request_ns: int) -> None: ...

    def record_execution(self, batch_size: int, compute_input_ns: int, compute_infer_ns: int,
                         compute_output_ns: int) -> None: ...


class DefaultScheduler(QueueLifecycle):
    def __init__(self, model_name: str, executors: Sequence[Executor], stats: StatsSink, max_queue_size: int,
                 max_batch_requests: int = 1, batched: bool = False, runners_per_instance: int = 1,
                 gate: RateGate | None = None) -> None:
        self.model_name = model_name
        self.batched = batched  # max_batch_size > 0: dim 0 of the inputs counts batch items
        self.executors = executors
        # the rate limiter's instances (rate_gate.py) take a batch only with a grant; the others as always
        self._gate = gate
        self._free = executors if gate is None else gate.unlimited(executors)
        if gate is not None:
            gate.bind(self._feed)
        self.stats = stats
        self.queue: WorkQueue[QueuedRequest] = WorkQueue(max_queue_size)
        self._max_queue = max_queue_size
        self._waiting = self.queue.items  # its deque, read directly on the request path (no call per check)
        self.max_batch_requests = max_batch_requests
        self.depth = max(1, runners_per_instance)  # batches one instance may hold at once
        # per instance, batches handed to it and not yet answered: new work goes to the least busy
        self._held = {id(e): 0 for e in executors}
        self._next = 0  # round-robin start among equally busy instances
        self._init_lifecycle()

    # ---- lifecycle ----
    def start(self) -> None:
        self._started = True
        for ex in self.executors:
            self.instance_changed(ex)

    def instance_changed(self, executor: Executor) -> None:
        """Called whenever an instance's readiness may have changed."""
        if id(executor) not in self._held:
            return
        if self._gate is not None:
            self._gate.instance_changed(executor)
        if executor.ready:
            self._feed()
        else:
            self._instance_down()

    # ---- request path ----
    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        self._refuse_unless_open()
        waiting = self._waiting
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        item = queued(self, request, loop)
        # idle is set only while nothing is queued or running (_check_idle): with either, it is clear already
        idle = not waiting and not self._running
        executor = (shared.least_busy(self._free, self._held, self.depth, self._next)
                    if not waiting and self._started else None)
        if executor is None:
            if 0 < self._max_queue <= len(waiting):  # (WorkQueue.full, inline)
                self.stats.record_failure("REJECTED", 0)
                raise InferdError(ErrorCode.UNAVAILABLE, "[request id: %s] Exceeds maximum queue size"  # as Triton
                                  % (request.id or "<id_unknown>"))
            waiting.append(item)
            if self._gate is not None and self._started:
                self._gate.stage(self._held)
        if idle:
            self._idle.clear()
        if executor is not None:
            self._run(executor, [item])
        return item

    def withdraw(self, item: QueuedRequest) -> None:
        """`item` was just cancelled: it leaves the queue at once, or is cancelled in the worker running it."""
        if item.executor is not None:
            item.executor.cancel([item.request])
        elif self.queue.remove(item):
            self.stats.record_failure("CANCELED", time.monotonic_ns() - item.request.arrival_ns)
            if self._gate is not None and not self._waiting:
                self._gate.unstage()
            self._check_idle()

    def _fail_queued(self, code: ErrorCode, message: str) -> None:
        for item in self.queue.drain():
            if not item.done():
                self.stats.record_failure("OTHER", time.monotonic_ns() - item.request.arrival_ns)
                item.set_exception(InferdError(code, message))
        if self._gate is not None:
            self._gate.unstage()
        self._check_idle()

    def _on_close(self) -> None:
        if self._gate is not None:
            self._gate.close()

    def _check_idle(self) -> None:
        if not self._waiting and not self._running:
            self._idle.set()

    # ---- dispatching ----
    def _feed(self) -> None:
        """Hand queued requests to instances with room."""
        if not self._started:
            return
        waiting = self._waiting
        gate = self._gate
        while waiting:
            executor = gate.take() if gate is not None else None
            if executor is None:
                executor = shared.least_busy(self._free, self._held, self.depth, self._next)
            if executor is None:
                if gate is not None:
                    gate.stage(self._held)
                return
            if self.max_batch_requests == 1:  # (_take_batch of one, inline)
                item = waiting.popleft()
                if item.done():  # cancelled by the client while queued
                    continue
                batch = [item]
            else:
                batch = self._take_batch(executor)
                if not batch:
                    break
            self._run(executor, batch)
        if gate is not None and not waiting:
            gate.unstage()
        self._check_idle()

    def _take_batch(self, executor: Executor) -> list[QueuedRequest]:
        batch: list[QueuedRequest] = []
        waiting = self._waiting
        limit = self.max_batch_requests
        while waiting and len(batch) < limit:
            item = waiting.popleft()
            if item.done():  # cancelled by the client while queued
                continue
            batch.append(item)
        return batch

    def _run(self, executor: Executor, batch: list[QueuedRequest]) -> None:
        """Send one batch now; its answers settle the requests' futures in `_finished`."""
        for item in batch:
            item.executor = executor
        self._held[id(executor)] += 1
        if self._gate is not None:
            self._gate.launching(executor)
        executors = self.executors
        if len(executors) > 1:
            self._next = (executors.index(executor) + 1) % len(executors)
        done = functools.partial(self._finished, executor, batch, time.monotonic_ns())
        requests = [batch[0].request] if len(batch) == 1 else [p.request for p in batch]
        self._running.add(shared.launch(executor, requests, done, eager=True))

    def _items(self, request: InferRequest) -> int:
        if self.batched and request.inputs and request.inputs[0].shape:
            return max(1, request.inputs[0].shape[0])
        return 1

    def _finished(self, executor: Executor, batch: list[QueuedRequest], start: int, fut: asyncio.Future[Any]) -> None:
        self._running.discard(fut)
        self._held[id(executor)] -= 1
        if self._gate is not None:
            self._gate.executed(executor)
        if fut.cancelled():  # close(): the model is going away
            error = InferdError(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.model_name)
            for item in batch:
                outcomes.settle(item, error)
            self._check_idle()
            return
        if fut.exception() is None:  # (outcomes.answers_of's common case, inline)
            result = fut.result()
            answers = result.responses
        else:
            result, answers = outcomes.answers_of(fut, len(batch), executor.name)
        self._feed()  # the next queued request goes out before these answers are written
        # Triton's figures (as outcomes.record) and the answers, in one plain loop: inference_count counts
        # the batch items that succeeded; a request the client cancelled meanwhile counts as CANCELED
        stats = self.stats
        end = time.monotonic_ns()
        batched = self.batched
        items_ok = 0
        succeeded = []
        for item, answer in zip(batch, answers):
            if isinstance(answer, InferdError):
                if item.cancelled():
                    stats.record_failure("CANCELED", end - item.request.arrival_ns)
                    continue
                stats.record_failure("CANCELED" if answer.code == ErrorCode.CANCELLED else "BACKEND",
                                     end - item.request.arrival_ns)
                if not item.done():
                    item.set_exception(answer)
                continue
            items_ok += self._items(item.request) if batched else 1
            if item.cancelled():  # the client gave up while it ran: its answer is dropped
                stats.record_failure("CANCELED", end - item.request.arrival_ns)
                continue
            succeeded.append(item.request.arrival_ns)
            if not item.done():
                eager = item.eager
                if eager is None:
                    item.set_result(answer)
                else:  # taken back before set_result schedules it; the answer leaves now, the figures after
                    item.eager = None
                    item.remove_done_callback(eager)
                    item.set_result(answer)
                    try:
                        eager(item)
                    except Exception:  # (as the loop logs a failed callback)
                        log.exception("a request's done-callback failed")
        if items_ok:  # (answers that are not errors come with a result)
            merged = result.execution_items  # (outcomes.executed_items, inline)
            executed = items_ok if merged is None else merged
            if executed:
                stats.record_execution(executed, result.compute_input_ns, result.compute_infer_ns,
                                       result.compute_output_ns)
        if succeeded:
            stats.record_successes(succeeded, start, end, result.compute_input_ns, result.compute_infer_ns,
                                   result.compute_output_ns)
        if not self._waiting and not self._running:  # (_check_idle, inline)
            self._idle.set()
