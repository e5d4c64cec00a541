"""The dynamic batcher (`dynamic_batching {}`): priority-level queues with queue policies, batches formed
when an instance can take them (scheduler.batching), spread over the instances, optionally answered in
request order (`preserve_ordering`).

A batch is formed only when an instance has room for it, never eagerly: an idle instance gets the best
batch the rules allow now; an instance already running a batch (up to the worker pipeline depth) only
takes one that cannot get better by waiting, so a backlog keeps the worker busy while a light load
still forms big batches. Forming runs once per event-loop pass after arrivals, completions, readiness
changes and delay timers, so requests arriving together are considered together. A batch's answers
leave within the call that reads them (`eager`); an instance of a model whose batches run long next to
answering them, freed with less than a full batch queued, takes its next one after the loop's next read,
which brings the requests of the clients just answered (`_refill`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest, InferResponse
from . import outcomes, shared
from .base import Executor
from .batching import BatchRules, form_batch
from .default import StatsSink
from .outcomes import settle
from .policy import REJECT, PriorityPolicy
from .queue import PriorityQueue
from .rate_gate import RateGate
from .shared import QueuedRequest, QueueLifecycle

log = logging.getLogger("inferd.scheduler")

_UNSET = object()
# `_refill` waits a loop pass for the clients just answered only when batches run this many times longer than
# answering one takes: the wait (about an answer pass and a read pass) then costs at most a few % of a batch
WAIT_RATIO = 10


class Pending(QueuedRequest):
    """A queued request of the dynamic batcher and the future its caller awaits, in one object. Its fields
    are set by `submit` (no __init__ of its own: a Python __init__ calling the future's costs a frame more
    per request)."""

    __slots__ = ("level", "items", "key", "arrival_ns", "timer", "outcome")
    level: int
    items: int
    key: Any
    arrival_ns: int
    timer: asyncio.TimerHandle | None
    outcome: Any  # preserve_ordering: the answer, held until earlier ones are out


class DynamicBatcher(QueueLifecycle):
    def __init__(self, model_name: str, executors: Sequence[Executor], stats: StatsSink, rules: BatchRules,
                 policy: PriorityPolicy, preserve_ordering: bool = False, depth: int = 1,
                 gate: RateGate | None = None) -> None:
        self.model_name = model_name
        self.executors = list(executors)
        # the rate limiter's instances (rate_gate.py) take a batch only with a grant; the others as always
        self._gate = gate
        self._free = self.executors if gate is None else gate.unlimited(self.executors)
        if gate is not None:
            gate.bind(self._dispatch)
        self.stats = stats
        self.rules = rules
        self.policy = policy
        self.preserve_ordering = preserve_ordering
        self.depth = max(1, depth)  # batches one instance may hold at once
        self.queue: PriorityQueue[Pending] = PriorityQueue([p.max_queue_size for p in policy.levels])
        self.running = 0  # requests handed to instances and not yet answered
        self._held = {id(e): 0 for e in self.executors}  # batches per instance
        # instances whose worker merges the batches waiting for it (a frontend process's direct instances): a
        # batch the rules would send to an idle instance goes to them busy or not, to be merged there with
        # the other frontends' batches, instead of growing here while they run
        self._merging = {id(e) for e in self.executors if getattr(e, "merges_batches", False)}
        self._next = 0  # round-robin start among equally loaded instances
        self._order: deque[Pending] = deque()  # preserve_ordering: dispatched, not yet released
        self._kicked = False
        # moving averages of a batch's run and of answering it (ns), for `_refill`
        self._run_ns = 0
        self._answer_ns = 0
        self._timer: asyncio.TimerHandle | None = None
        # what `submit` may skip for the usual config (one level, no queue bound or timeout, any requests
        # batch together): decided once here
        self._one_level = len(policy.levels) == 1
        self._bounded = any(p.max_queue_size for p in policy.levels)
        self._timeouts = any(p.default_timeout_us for p in policy.levels)
        self._keyed = bool(rules.must_match or rules.has_optional)
        self._init_lifecycle()

    # ---- lifecycle ----
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = True
        self._kick()

    def instance_changed(self, executor: Executor) -> None:
        if self._gate is not None:
            self._gate.instance_changed(executor)
        if executor.ready:
            self._kick()
        else:
            self._instance_down()

    def _on_close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._order.clear()
        if self._gate is not None:
            self._gate.close()

    # ---- request path ----
    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        if self._closed:
            self._refuse_unless_open()
        for executor in self.executors:  # _refuse_unless_open's readiness check, inline: a call less per request
            if executor.ready:
                break
        else:
            self._refuse_unless_open()
        level = 0 if self._one_level else self.policy.level_of(request.priority)
        if self._bounded and self.queue.full(level):
            self.stats.record_failure("REJECTED", 0)
            raise InferdError(ErrorCode.UNAVAILABLE, "[request id: %s] Exceeds maximum queue size"  # as Triton
                              % (request.id or "<id_unknown>"))
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        rules = self.rules
        inputs = request.inputs  # rules.items_of, inline
        items = inputs[0].shape[0] if inputs and rules.batched and inputs[0].shape else 1
        item = Pending(loop=loop)
        item._scheduler = self
        item.request = request
        item.executor = None
        item.eager = None
        item.level = level
        item.items = items if items > 1 else 1
        item.key = rules.key_of(request) if self._keyed else None
        item.arrival_ns = request.arrival_ns
        item.timer = None
        item.outcome = _UNSET
        if self._timeouts:
            timeout_us = self.policy.levels[level].timeout_us(request.timeout_us)
            if timeout_us:
                remaining_s = (request.arrival_ns + timeout_us * 1000 - time.monotonic_ns()) / 1e9
                item.timer = loop.call_later(max(0.0, remaining_s), self._expire, item)
        self.queue.put(level, item)
        self._idle.clear()
        if not self._kicked:
            self._kick()
        return item

    def withdraw(self, item: Pending) -> None:
        """`item` was just cancelled: it leaves the queue at once, or is cancelled in the worker running it."""
        if item.timer is not None:
            item.timer.cancel()
        if item.executor is not None:
            item.executor.cancel([item.request])
        elif self.queue.remove(item.level, item):
            self.stats.record_failure("CANCELED", time.monotonic_ns() - item.arrival_ns)
            self._check_idle()
            self._kick()  # the queue front may have changed

    def _expire(self, item: Pending) -> None:
        item.timer = None
        if item.done() or item.executor is not None:
            return
        if self.policy.levels[item.level].timeout_action == REJECT:
            if self.queue.remove(item.level, item):
                self.stats.record_failure("REJECTED", time.monotonic_ns() - item.arrival_ns)
                item.set_exception(InferdError(ErrorCode.UNAVAILABLE, "Request timeout expired"))
                self._check_idle()
                self._kick()
        elif self.queue.delay(item.level, item):
            self._kick()

    def _fail_queued(self, code: ErrorCode, message: str) -> None:
        for item in self.queue.drain():
            if item.timer is not None:
                item.timer.cancel()
            if not item.done():
                self.stats.record_failure("OTHER", time.monotonic_ns() - item.arrival_ns)
                item.set_exception(InferdError(code, message))
        self._check_idle()

    def _check_idle(self) -> None:
        if self.running == 0 and not len(self.queue):
            self._idle.set()

    # ---- forming and dispatching batches ----
    def _kick(self) -> None:
        """Form batches once this event-loop pass is over (arrivals of the same pass batch together)."""
        if not self._kicked and self._started and self._loop is not None:
            self._kicked = True
            self._loop.call_soon(self._dispatch)

    def _refill(self) -> None:
        """An instance has room again. A full batch waiting goes at once. Otherwise, for a model whose
        batches run long next to the time answering one takes (`_run_ns` >= WAIT_RATIO x `_answer_ns`),
        forming waits for the loop to read the requests already at the door (the answers just written
        bring their clients' next ones), so clients answered together stay in one batch instead of
        splitting into cohorts; that wait is then a small part of a batch's time. A fast model's queued
        requests leave at once: keeping its instance busy is worth more than a bigger batch."""
        queued = len(self.queue)
        if not queued:
            return  # (an arrival forms its own)
        answer_ns = self._answer_ns
        if (queued >= self.rules.max_items or self._loop is None or not answer_ns
                or self._run_ns < WAIT_RATIO * answer_ns):
            self._dispatch()
        else:
            self._loop.call_soon(self._kick)  # _kick's own call_soon: forming runs after the next I/O poll

    def _timed(self, run_ns: int, answered_from: int) -> None:
        """A batch's run (launch to answer) and the time its answering took, into moving averages."""
        answer_ns = time.monotonic_ns() - answered_from
        if not self._answer_ns:
            self._run_ns, self._answer_ns = run_ns, max(1, answer_ns)
        else:
            self._run_ns += (run_ns - self._run_ns) // 4
            self._answer_ns += (answer_ns - self._answer_ns) // 4

    def _dispatch(self) -> None:
        self._kicked = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queue = self.queue
        gate = self._gate
        while len(queue) and self._started:
            executor = gate.take() if gate is not None else None
            if executor is None:
                executor = shared.least_busy(self._free, self._held, self.depth, self._next)
            if executor is None:
                if gate is not None:
                    self._stage(gate)
                return
            now = time.monotonic_ns()
            decision = form_batch(self.rules, queue, now,
                                  busy=self._held[id(executor)] > 0 and id(executor) not in self._merging)
            if not decision.count:
                if decision.wait_until_ns and self._loop is not None:
                    self._timer = self._loop.call_later((decision.wait_until_ns - now) / 1e9, self._kick)
                return
            self._launch(executor, queue.pop_front(decision.count))
        if gate is not None:
            gate.unstage()  # nothing queued (or closed): no instance needs to wait for resources

    def _stage(self, gate: RateGate) -> None:
        """No instance can take a batch: once the rules would send one to an idle instance, a limited
        instance waits for its resources (the batch is formed when they are granted, so it may grow)."""
        now = time.monotonic_ns()
        decision = form_batch(self.rules, self.queue, now, busy=False)
        if decision.count:
            gate.stage(self._held)
        elif decision.wait_until_ns and self._loop is not None:
            self._timer = self._loop.call_later((decision.wait_until_ns - now) / 1e9, self._kick)

    def _launch(self, executor: Executor, batch: list[Pending]) -> None:
        """Send one batch now (no task: the Execute leaves within this call); `_finished` answers it."""
        self._held[id(executor)] += 1
        if self._gate is not None:
            self._gate.launching(executor)
        self._next = (self.executors.index(executor) + 1) % len(self.executors)
        self.running += len(batch)
        for item in batch:
            if item.timer is not None:
                item.timer.cancel()
                item.timer = None
            item.executor = executor
        if self.preserve_ordering:
            self._order.extend(batch)
        launched = _Launched(self, executor)
        done = functools.partial(self._finished, launched, batch, time.monotonic_ns())
        self._running.add(shared.launch(executor, [p.request for p in batch], done, launched.free,
                                          eager=True))  # _finished runs as the answer is read

    def _freed(self, launched: _Launched) -> None:
        """The instance has an answer for a batch: it may take the next one (`_refill`: a full one leaves
        now, before that answer is read). Called by the instance (`on_free`); an instance that never
        calls it gets its place back in `_finished`."""
        if not launched.freed:
            launched.freed = True
            self._held[id(launched.executor)] -= 1
            if self._gate is not None:
                self._gate.executed(launched.executor)
            self._refill()

    def _finished(self, launched: _Launched, batch: list[Pending], start: int, fut: asyncio.Future[Any]) -> None:
        now = time.monotonic_ns()
        self._running.discard(fut)
        executor = launched.executor
        freed_here = not launched.freed  # (else `_freed` refilled when the answer arrived)
        if freed_here:
            launched.freed = True
            self._held[id(executor)] -= 1
            if self._gate is not None:
                self._gate.executed(executor)
        self.running -= len(batch)
        if fut.cancelled():  # close(): the model is going away
            error = InferdError(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.model_name)
            for item in batch:
                settle(item, error)
            self._check_idle()
            return
        if freed_here:
            self._refill()
        result, answers = outcomes.answers_of(fut, len(batch), executor.name)
        if result is not None and not self.preserve_ordering:
            answering = time.monotonic_ns()
            outcomes.record_and_settle(self.stats, result, answers, batch, start)
            self._timed(now - start, answering)
            self._check_idle()
            return
        items = sum(p.items for p, a in zip(batch, answers) if not isinstance(a, InferdError))
        outcomes.record(self.stats, result, answers, [p.arrival_ns for p in batch], batch,
                        items, start)
        if self.preserve_ordering:
            for item, answer in zip(batch, answers):
                item.outcome = answer
            self._release_in_order()
        else:
            for item, answer in zip(batch, answers):
                settle(item, answer)
        self._check_idle()

    def _release_in_order(self) -> None:
        order = self._order
        while order and (order[0].outcome is not _UNSET or order[0].done()):
            item = order.popleft()
            if item.outcome is not _UNSET:
                settle(item, item.outcome)


class _Launched:
    """A batch handed to an instance: whether its place there was given back yet (`free`, called by the
    instance when the answer arrives, or `_finished`)."""

    __slots__ = ("batcher", "executor", "freed")

    def __init__(self, batcher: DynamicBatcher, executor: Executor) -> None:
        self.batcher = batcher
        self.executor = executor
        self.freed = False

    def free(self) -> None:
        self.batcher._freed(self)
