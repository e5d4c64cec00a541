"""What the default scheduler, the dynamic batcher and the sequence batcher share, in the order a request
meets it: the future a caller awaits for a queued request (`QueuedRequest`), the queue's lifecycle
(`QueueLifecycle`: started, refusing, draining, closed) and handing a batch to an instance (`least_busy`,
`launch`). Each scheduler keeps its own queue and batching.

The queued request's future: cancelling it (a dropped connection, a client timeout, a cancelled task
awaiting it) tells the scheduler at once, through `cancel` itself. A done-callback per request would cost a
callback handle and a call on every answer, cancelled or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferRequest, InferResponse
from .base import Executor


class Withdraws(Protocol):
    def withdraw(self, item: Any) -> None:
        """`item` was just cancelled: take it out of the queue, or cancel it in the worker running it."""


class QueuedRequest(asyncio.Future[InferResponse]):
    """Made by `queued`: without an __init__ of its own, a future subclass costs no more than a plain future
    (one with a Python __init__ calling super().__init__ cost 0.7 µs against 0.15)."""

    __slots__ = ("request", "executor", "_scheduler", "eager")
    request: InferRequest
    executor: Executor | None  # the instance running it, once dispatched
    # a done-callback of the caller's (also added with add_done_callback) that the scheduler runs itself,
    # right after it answers the request, instead of leaving it to the loop's next pass: at concurrency 1
    # that pass is a loop iteration per request. Every other outcome (an error, a cancel) runs it as usual
    eager: Callable[[Any], None] | None
    _scheduler: Withdraws

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self._scheduler.withdraw(self)
        return True


def queued(scheduler: Withdraws, request: InferRequest, loop: asyncio.AbstractEventLoop) -> QueuedRequest:
    item = QueuedRequest(loop=loop)
    item._scheduler = scheduler
    item.request = request
    item.executor = None
    item.eager = None
    return item


# ---- the queue's lifecycle ----

class QueueLifecycle:
    model_name: str
    executors: Sequence[Executor]
    queue: Any  # the subclass's queue (len() = requests waiting)

    def _init_lifecycle(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()  # batches handed to instances, not yet answered
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pending_count(self) -> int:
        return len(self.queue)

    @property
    def idle(self) -> bool:
        """Nothing queued or running."""
        return self._idle.is_set()

    def _refuse_unless_open(self) -> None:
        """Raise UNAVAILABLE for a request that cannot be queued: closed, or no instance ready."""
        if self._closed:
            raise InferdError(ErrorCode.UNAVAILABLE, "model '%s' is not accepting requests" % self.model_name)
        for executor in self.executors:  # (a loop: no generator per request)
            if executor.ready:
                return
        raise InferdError(ErrorCode.UNAVAILABLE, "no ready instance of model '%s'" % self.model_name)

    def _instance_down(self) -> None:
        """An instance stopped being ready: with none left, queued requests fail at once (readiness tells
        the truth)."""
        if not any(e.ready for e in self.executors):
            self._fail_queued(ErrorCode.UNAVAILABLE, "no ready instance of model '%s'" % self.model_name)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; wait (bounded) until queued and running ones are answered."""
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            self._fail_queued(ErrorCode.UNAVAILABLE, "model '%s' is unloading" % self.model_name)

    async def close(self) -> None:
        """Fail what is queued; batches still running are cancelled (their callbacks answer their
        requests: UNAVAILABLE, unloaded)."""
        self._closed = True
        self._started = False
        self._on_close()
        for fut in list(self._running):
            fut.cancel()
        self._fail_queued(ErrorCode.UNAVAILABLE, "model '%s' is unloaded" % self.model_name)

    def _on_close(self) -> None:
        """What the subclass stops before its running batches are cancelled (timers)."""

    def _fail_queued(self, code: ErrorCode, message: str) -> None:
        raise NotImplementedError


# ---- handing a batch to an instance (the default scheduler and the dynamic batcher) ----

def least_busy(executors: Sequence[Executor], loads: dict[int, int], depth: int, first: int) -> Executor | None:
    """The ready instance holding the fewest batches (`loads` by id), fewer than `depth`; ties go to the
    first in round-robin order from index `first`. None when every ready instance is full."""
    n = len(executors)
    if n == 1:  # one instance (the common case): no loop
        e = executors[0]
        return e if loads[id(e)] < depth and e.ready else None
    best: Executor | None = None
    best_load = depth
    for i in range(n):
        e = executors[(first + i) % n]
        load = loads[id(e)]
        if load < best_load and e.ready:
            best, best_load = e, load
            if load == 0:
                break
    return best


def launch(executor: Executor, requests: list[InferRequest],
           on_done: Callable[[asyncio.Future[Any]], None],
           on_free: Callable[[], None] | None = None, eager: bool = False) -> asyncio.Future[Any]:
    """Send the batch now; `on_done(future)` runs when it is answered. A batch the instance refuses
    (not ready, could not be sent) fails through the same callback instead of raising. `on_free`, if
    given, is passed on: the instance may call it when the answer arrives, before reading it. `eager`:
    an instance whose future offers it (instances.pipeline.BatchFuture) runs `on_done` as it reads the
    answer, not on the loop's next pass."""
    try:
        fut = executor.launch(requests) if on_free is None else executor.launch(requests, on_free)
    except Exception as exc:
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(exc)
    fut.add_done_callback(on_done)
    if eager and hasattr(fut, "eager"):
        fut.eager = on_done  # type: ignore[attr-defined]
    return fut
