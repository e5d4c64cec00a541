"""What a finished batch means for its requests, shared by the default scheduler and the dynamic batcher:
the answer per request from the batch's future, and the statistics Triton keeps for it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, TypeAlias

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferResponse

log = logging.getLogger("inferd.scheduler")

Answer: TypeAlias = "InferResponse | InferdError"


def answers_of(fut: asyncio.Future[Any], count: int, executor_name: str) -> tuple[Any, list[Answer]]:
    """(the BatchResult or None, one answer per request) of a done, not cancelled, batch future."""
    exc = fut.exception()
    if exc is None:
        result = fut.result()
        return result, result.responses
    if isinstance(exc, InferdError):
        return None, [exc] * count
    # a bug on our side: fail the batch, keep serving
    log.error("instance %s failed a batch", executor_name, exc_info=exc)
    return None, [InferdError(ErrorCode.INTERNAL, "internal error: %s" % exc)] * count


def executed_items(result: Any, items_ok: int) -> int:
    """The batch items one batch's execution counts: its items that succeeded, unless the worker merged it with
    other batches (instances.results.BatchResult.execution_items: the merged execution is counted once)."""
    merged = result.execution_items
    return items_ok if merged is None else merged


def record(stats: Any, result: Any, answers: Sequence[Answer], arrivals: Sequence[int],
           futures: Sequence[asyncio.Future[Any]], items_ok: int, start_ns: int) -> None:
    """Triton's figures for one batch: its execution (inference_count counts the batch items that
    succeeded) and each request's outcome; a request the client cancelled meanwhile counts as CANCELED."""
    end = time.monotonic_ns()
    executed = executed_items(result, items_ok) if result is not None and items_ok else 0
    if executed:
        stats.record_execution(executed, result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns)
    succeeded = []
    for arrival, future, answer in zip(arrivals, futures, answers):
        if future.cancelled():  # the client gave up while it ran: its answer is dropped
            stats.record_failure("CANCELED", end - arrival)
        elif isinstance(answer, InferdError):
            stats.record_failure("CANCELED" if answer.code == ErrorCode.CANCELLED else "BACKEND", end - arrival)
        elif result is not None:
            succeeded.append(arrival)
    if succeeded:
        stats.record_successes(succeeded, start_ns, end, result.compute_input_ns, result.compute_infer_ns,
                               result.compute_output_ns)


def record_and_settle(stats: Any, result: Any, answers: Sequence[Answer], batch: Sequence[Any], start_ns: int) -> None:
    """`record` and `settle` in one pass, for a batch the instance answered (`result`, not None) whose
    requests (futures with `.items`, `.arrival_ns` and `.eager`) are answered at once: the dynamic batcher's
    usual case, per request the least it can do. A request's `eager` done-callback runs here, after the
    figures, instead of on the loop's next pass."""
    end = time.monotonic_ns()
    items_ok = 0
    succeeded = []
    failed: list[tuple[str, int]] = []
    eager: list[tuple[Any, Any]] = []
    for item, answer in zip(batch, answers):
        if isinstance(answer, InferdError):
            if not item.cancelled():
                failed.append(("CANCELED" if answer.code == ErrorCode.CANCELLED else "BACKEND", item.arrival_ns))
                if not item.done():
                    item.set_exception(answer)
                continue
        else:
            items_ok += item.items
            if not item.cancelled():
                succeeded.append(item.arrival_ns)
                if not item.done():
                    callback = item.eager
                    if callback is not None:  # taken back before set_result schedules it
                        item.eager = None
                        item.remove_done_callback(callback)
                        eager.append((callback, item))
                    item.set_result(answer)
                continue
        failed.append(("CANCELED", item.arrival_ns))  # the client gave up while it ran: its answer is dropped
    executed = executed_items(result, items_ok) if items_ok else 0
    if executed:
        stats.record_execution(executed, result.compute_input_ns, result.compute_infer_ns, result.compute_output_ns)
    for reason, arrival in failed:
        stats.record_failure(reason, end - arrival)
    if succeeded:
        stats.record_successes(succeeded, start_ns, end, result.compute_input_ns, result.compute_infer_ns,
                               result.compute_output_ns)
    for callback, item in eager:  # the answers leave now, once the figures count them
        try:
            callback(item)
        except Exception:  # (as the loop logs a failed callback)
            log.exception("a request's done-callback failed")


def settle(future: asyncio.Future[Any], answer: Answer) -> None:
    if future.done():
        return
    if isinstance(answer, InferdError):
        future.set_exception(answer)
    else:
        future.set_result(answer)
