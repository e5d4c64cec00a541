"""The sequence batcher (`sequence_batching`): stateful models, reference/triton.md §6.4.

Every request names its sequence by correlation id (uint64 or string, `sequence_id`) and must have
batch size 1. A sequence's first request carries START; END releases its slot; START on an id still
in flight ends the old sequence early (a warning, as Triton) and the new one keeps the slot. A request
of an unknown or ended sequence is refused with Triton's INVALID_ARG message. A sequence's requests
run one at a time, in arrival order, on the instance whose slot it holds (lanes.py).

The worker gets a copy of each request with the control inputs and the implicit state, and null
requests in empty slots below the highest busy one (requests.py); their answers are dropped.

`max_sequence_idle_microseconds`: a sequence without a request for that long (none queued or
running) is released with a logged warning; a later request of it without START then fails, with
a message saying it was released for idleness.

Cancellation: a cancelled queued request fails the sequence's other queued requests (CANCELLED) and
ends the sequence; a running one is cancelled in its worker. Request `timeout`s and queue policies
do not apply (Triton's are experimental and direct-only); the server-wide max queue size does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from collections.abc import Sequence as Seq
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError, invalid_arg

from ...inference.types import SEQUENCE_END, SEQUENCE_START, InferRequest, InferResponse
from ..base import Executor
from ..rate_gate import RateGate
from ..shared import QueueLifecycle
from . import state
from .lanes import Lane, SeqItem, Sequence, parse_policy
from .requests import WorkerRequests

log = logging.getLogger("inferd.scheduler.sequence")

MAX_CORRELATION_ID_CHARS = 128  # Triton's limit for string ids
MAX_SEQUENCES = 65536  # sequences tracked at once (running or backlogged): bounds client-made state
RECENTLY_IDLED = 4096  # ids released for idleness that we remember, for a clearer error


class SequenceScheduler(QueueLifecycle):
    """Slots per sequence on each instance (lanes.py); the lifecycle is the other schedulers'
    (lifecycle.py), its own close stopping the runners first."""

    def __init__(self, model_name: str, config: dict[str, Any], executors: Seq[Executor], stats: Any,
                 max_queue_size: int = 0, model_dir: str | None = None, gate: RateGate | None = None) -> None:
        self.model_name = model_name
        self.executors = executors
        self._gate = gate  # the rate limiter's instances wait for their resources before each batch
        self.stats = stats  # record_success / record_failure / record_execution (metrics.model_statistics.ModelStats)
        self.max_queue_size = max_queue_size
        sb = config.get("sequence_batching") or {}
        self.max_batch_size = int(config.get("max_batch_size") or 0)
        self.batched = self.max_batch_size > 0
        self.policy = parse_policy(config)
        if model_dir is None and executors:  # an Instance knows its model directory (initial_state data_file)
            model_dir = getattr(getattr(executors[0], "load", None), "model_dir", None)
        self.worker_requests = WorkerRequests(model_name, config, model_dir)
        self.idle_s = (int(sb.get("max_sequence_idle_microseconds") or 0) or 1_000_000) / 1e6
        self.iterative = bool(sb.get("iterative_sequence"))  # requests may be rescheduled by the model
        self._single_ids = itertools.count(1)
        self.lanes = [Lane(e, self.policy.slots) for e in executors]
        self.sequences: dict[int | str, Sequence] = {}
        self.backlog: collections.deque[Sequence] = collections.deque()
        self.idled: collections.OrderedDict[int | str, None] = collections.OrderedDict()
        self.queued = 0  # requests waiting (not yet handed to an instance)
        self.running = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._init_lifecycle()

    # ---- lifecycle ----
    def start(self) -> None:
        for lane in self.lanes:
            self._tasks.append(asyncio.create_task(self._runner(lane), name="seq-runner-" + lane.executor.name))
        self._tasks.append(asyncio.create_task(self._reaper(), name="seq-reaper-" + self.model_name))

    def instance_changed(self, executor: Executor) -> None:
        for lane in self.lanes:
            if lane.executor is executor:
                lane.wake.set()
        self._instance_down()

    @property
    def pending_count(self) -> int:
        return self.queued

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
        try:
            sequence = self._admit(request)
        except InferdError:
            self.stats.record_failure("REJECTED", 0)
            raise
        loop = asyncio.get_running_loop()
        item = SeqItem(request, loop.create_future(), sequence)
        sequence.queue.append(item)
        sequence.last_ns = time.monotonic_ns()
        if request.flags & SEQUENCE_END or sequence.single:
            sequence.open = False
        self.queued += 1
        self._idle.clear()
        item.future.add_done_callback(functools.partial(self._on_done, item))
        if sequence.lane is not None:
            sequence.lane.wake.set()
        return item.future

    def _admit(self, request: InferRequest) -> Sequence:
        """The sequence a request joins (created on START); raises InferdError when it cannot be queued."""
        model = self.model_name
        self._refuse_unless_open()
        corr = request.correlation_id
        if isinstance(corr, int) and corr < 0:  # a gRPC int64 id: Triton reads its bits as uint64
            corr = request.correlation_id = corr & 0xFFFFFFFFFFFFFFFF
        if (corr == 0 or corr == "") and self.iterative:
            return self._single()
        if corr == 0 or corr == "":
            raise invalid_arg("inference request to model '%s' must specify a non-zero or non-empty correlation ID"
                              % model)
        if isinstance(corr, str) and len(corr) > MAX_CORRELATION_ID_CHARS:
            raise invalid_arg("string correlation ID of a request to model '%s' must be at most %d characters"
                              % (model, MAX_CORRELATION_ID_CHARS))
        if self.batched and any(t.shape[:1] != [1] for t in request.inputs):
            raise invalid_arg("inference request to model '%s' must specify batch-size 1 due to requirements "
                              "of sequence batcher" % model)
        if 0 < self.max_queue_size <= self.queued:
            raise InferdError(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")
        sequence = self.sequences.get(corr)
        if not request.flags & SEQUENCE_START:
            if sequence is None or not sequence.open:
                raise invalid_arg(self._no_start_message(corr))
            return sequence
        if sequence is not None:
            if sequence.open:
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before "
                            "this sequence start. Previous sequence will be terminated early.", corr, model)
            sequence.open = True
            return sequence
        if len(self.sequences) >= MAX_SEQUENCES:
            raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' already tracks %d sequences; end some first"
                              % (model, MAX_SEQUENCES))
        self.idled.pop(corr, None)
        sequence = Sequence(corr)
        self.sequences[corr] = sequence
        if not self._place(sequence):
            self.backlog.append(sequence)
        return sequence

    def _single(self) -> Sequence:
        """As Triton 2.51 accepts it: a request without a correlation id to an iterative_sequence model
        runs as a sequence of its own (a key no client id can take: client ids are >= 0 or strings)."""
        if len(self.sequences) >= MAX_SEQUENCES:
            raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' already tracks %d sequences; end some first"
                              % (self.model_name, MAX_SEQUENCES))
        sequence = Sequence(-next(self._single_ids), single=True)
        self.sequences[sequence.correlation_id] = sequence
        if not self._place(sequence):
            self.backlog.append(sequence)
        return sequence

    def _no_start_message(self, corr: int | str) -> str:
        message = ("inference request for sequence %s to model '%s' must specify the START flag on the first "
                   "request of the sequence" % (corr, self.model_name))
        if corr in self.idled:
            message += " (sequence %s was released after %d microseconds without a request)" % (
                corr, int(self.idle_s * 1e6))
        return message

    def _place(self, sequence: Sequence) -> bool:
        """Give a sequence a free slot on the lane with the most free slots (ready instances first)."""
        candidates = [lane for lane in self.lanes if lane.free_slots()]
        if not candidates:
            return False
        lane = max(candidates, key=lambda ln: (ln.executor.ready, ln.free_slots()))
        return lane.assign(sequence)

    def _release(self, sequence: Sequence, why: str = "") -> None:
        """End a sequence: free its slot for the backlog; its queued requests (if any) fail."""
        if sequence.dead:
            return
        sequence.dead = True
        if self.sequences.get(sequence.correlation_id) is sequence:
            del self.sequences[sequence.correlation_id]
        for item in sequence.queue:
            if not item.future.done():
                self.queued -= 1
                self.stats.record_failure("CANCELED", time.monotonic_ns() - item.request.arrival_ns)
                item.future.set_exception(InferdError(ErrorCode.CANCELLED, why or "sequence ended"))
        sequence.queue.clear()
        lane = sequence.lane
        if lane is not None:
            lane.release(sequence)
            self._fill_from_backlog()
        self._check_idle()

    def _fill_from_backlog(self) -> None:
        while self.backlog:
            sequence = self.backlog[0]
            if sequence.dead:
                self.backlog.popleft()
                continue
            if not self._place(sequence):
                return
            self.backlog.popleft()

    def _on_done(self, item: SeqItem, future: asyncio.Future[InferResponse]) -> None:
        if not future.cancelled():
            return
        sequence = item.sequence
        if item.worker_request is not None:  # running: the worker sees is_cancelled()
            if sequence.lane is not None:
                sequence.lane.executor.cancel([item.worker_request])
            return
        self.queued -= 1
        self.stats.record_failure("CANCELED", time.monotonic_ns() - item.request.arrival_ns)
        # the sequence cannot go on without this request: fail the rest and end it
        why = "an earlier request of sequence %s was cancelled" % sequence.correlation_id
        if sequence.busy:  # its running request finishes first; then the sequence is released
            for other in sequence.queue:
                if other is not item and not other.future.done():
                    self.queued -= 1
                    self.stats.record_failure("CANCELED", time.monotonic_ns() - other.request.arrival_ns)
                    other.future.set_exception(InferdError(ErrorCode.CANCELLED, why))
            sequence.queue.clear()
            sequence.open = False
            sequence.dead = True
            self.sequences.pop(sequence.correlation_id, None)
        else:
            self._release(sequence, why)
        self._check_idle()

    def _fail_queued(self, code: ErrorCode, message: str) -> None:
        for sequence in list(self.sequences.values()):
            for item in sequence.queue:
                if not item.future.done() and item.worker_request is None:
                    self.queued -= 1
                    self.stats.record_failure("OTHER", time.monotonic_ns() - item.request.arrival_ns)
                    item.future.set_exception(InferdError(code, message))
            sequence.queue.clear()
        self._check_idle()

    def _check_idle(self) -> None:
        if self.running == 0 and self.queued <= 0:
            self._idle.set()

    # ---- runners ----
    async def _runner(self, lane: Lane) -> None:
        executor = lane.executor
        wait_s: float | None = None
        while True:
            if wait_s is None:
                await lane.wake.wait()
            else:
                try:
                    await asyncio.wait_for(lane.wake.wait(), wait_s)
                except asyncio.TimeoutError:
                    pass
            lane.wake.clear()
            wait_s = None
            if not executor.ready:
                continue
            pick = self.policy.pick(lane, time.monotonic_ns())
            if not pick.items:
                wait_s = pick.wait_s or None
                continue
            if self._gate is not None and self._gate.is_limited(executor):
                await self._execute_limited(lane, self._gate)
            else:
                await self._execute(lane, pick.items)
            lane.wake.set()  # look again: more may be ready

    async def _execute_limited(self, lane: Lane, gate: RateGate) -> None:
        """A batch once the instance holds its rate-limiter resources (the wait counts as queue time); what
        it runs is picked then, so requests arriving meanwhile go along."""
        await gate.acquire(lane.executor)
        executed = False
        try:
            pick = self.policy.pick(lane, time.monotonic_ns())
            if pick.items and lane.executor.ready:
                executed = True
                await self._execute(lane, pick.items)
        finally:
            gate.release(lane.executor, executed)

    async def _execute(self, lane: Lane, picked: list[SeqItem | None]) -> None:
        real = [item for item in picked if item is not None]
        template = real[0].request
        worker_requests: list[InferRequest] = []
        for item in real:
            item.sequence.busy = True
            item.sequence.queue.popleft()
        self.queued -= len(real)
        self.running += len(real)
        start = time.monotonic_ns()
        try:
            for slot_item in picked:
                if slot_item is None:
                    worker_requests.append(self.worker_requests.null(template))
                else:
                    slot_item.worker_request = self.worker_requests.of(slot_item.request, slot_item.sequence)
                    worker_requests.append(slot_item.worker_request)
            result: Any = await lane.executor.execute(worker_requests)
            responses = list(result.responses)
        except asyncio.CancelledError:  # close(): answer what was running, then stop
            gone = InferdError(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.model_name)
            for item in real:
                if not item.future.done():
                    item.future.set_exception(gone)
            self.running -= len(real)
            raise
        except InferdError as exc:
            result, responses = None, [exc] * len(picked)
        except Exception as exc:  # a bug on our side: fail the batch, keep the runner alive
            log.exception("instance %s failed a sequence batch", lane.executor.name)
            result, responses = None, [InferdError(ErrorCode.INTERNAL, "internal error: %s" % exc)] * len(picked)
        end = time.monotonic_ns()
        done = [(item, resp) for item, resp in zip(picked, responses) if item is not None]
        succeeded = sum(1 for _, resp in done if not isinstance(resp, InferdError))
        if result is not None and succeeded:
            self.stats.record_execution(succeeded, result.compute_input_ns, result.compute_infer_ns,
                                        result.compute_output_ns)
        for item, response in done:
            self._finish(item, response, result, start, end)
        self.running -= len(real)
        self._check_idle()

    def _finish(self, item: SeqItem, response: InferResponse | InferdError, result: Any, start: int,
                end: int) -> None:
        sequence = item.sequence
        sequence.busy = False
        sequence.last_ns = end
        request_ns = end - item.request.arrival_ns
        if isinstance(response, InferResponse):
            sequence.state = state.capture(self.worker_requests.states, response, sequence.state)
        if item.future.cancelled():
            self.stats.record_failure("CANCELED", request_ns)
        elif isinstance(response, InferdError):
            self.stats.record_failure("CANCELED" if response.code == ErrorCode.CANCELLED else "BACKEND", request_ns)
            item.future.set_exception(response)
        else:
            self.stats.record_success(1, request_ns, start - item.request.arrival_ns, result.compute_input_ns,
                                      result.compute_infer_ns, result.compute_output_ns)
            item.future.set_result(response)
        if sequence.dead:  # cancelled while this request ran
            self._release_slot(sequence)
        elif (item.request.flags & SEQUENCE_END or sequence.single) and not sequence.queue:
            self._release(sequence)

    def _release_slot(self, sequence: Sequence) -> None:
        lane = sequence.lane
        if lane is not None:
            lane.release(sequence)
            self._fill_from_backlog()

    # ---- idle sequences ----
    async def _reaper(self) -> None:
        period = min(max(self.idle_s / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(period)
            self._reap(time.monotonic_ns())

    def _reap(self, now_ns: int) -> None:
        limit_ns = int(self.idle_s * 1e9)
        for sequence in list(self.sequences.values()):
            if sequence.busy or sequence.queue or now_ns - sequence.last_ns < limit_ns:
                continue
            log.warning("sequence %s for model '%s' had no request for %d microseconds and is released",
                        sequence.correlation_id, self.model_name, int(self.idle_s * 1e6))
            self._release(sequence)
            self.idled[sequence.correlation_id] = None
            while len(self.idled) > RECENTLY_IDLED:
                self.idled.popitem(last=False)
