"""Handing a batch to an instance, shared by the default scheduler and the dynamic batcher: which ready
instance takes it, and launching it so that its completion arrives as one callback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..inference.types import InferRequest
from .base import Executor


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


