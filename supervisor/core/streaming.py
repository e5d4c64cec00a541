"""ResponseStream: the responses of one decoupled request, from its worker process to the caller.

The instance side (instances.worker.WorkerProcess) feeds it on the event-loop thread: `attach` when
the request is sent to a worker (with a function that sends Cancel for it), `put` per response as
StreamResponses arrive, the last one with final=True. The core side (ServerDataPlane.stream_infer)
awaits `get` and calls `cancel` when its consumer goes away. Any scheduler carries such a request
unchanged: it only sees `InferRequest.response_sink`.

Bounded: a consumer that falls `limit` responses behind ends the request with UNAVAILABLE (and the
model is told to cancel), so a slow client cannot make the server hold an unbounded backlog.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from ..inference.types import InferResponse

DEFAULT_LIMIT = 4096  # responses buffered per request before it is failed

Item = tuple["InferResponse | InferdError", bool]  # (response or error, final)


class ResponseStream:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = max(1, limit)
        self._items: collections.deque[Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._canceller: Callable[[], None] | None = None
        self.ended = False  # the final item has been put (nothing more is taken)
        self.cancelled = False  # the consumer is gone
        self.responses = 0  # items put, the final one included
        self.errors = 0
        # (histogram, arrival ns): the model's first-response histogram, observed at the first item put
        # (--metrics-config histogram_latencies=true; metrics.model_statistics.ModelStats.first_response)
        self.first_response: tuple[Any, int] | None = None

    # ---- producer side (worker process) ----
    def attach(self, canceller: Callable[[], None]) -> None:
        """The request is on a worker now; `canceller()` asks that worker to cancel it."""
        self._canceller = None if self.ended else canceller
        if self.cancelled and self._canceller is not None:
            self._canceller()

    def put(self, item: InferResponse | InferdError, final: bool) -> None:
        if self.ended:
            return  # late items (after the final one, or after an overflow) are dropped
        if not self.responses and self.first_response is not None:
            histogram, arrival = self.first_response
            histogram.observe_ns(time.monotonic_ns() - arrival)
        self.responses += 1
        if isinstance(item, InferdError):
            self.errors += 1
        if final:
            self.ended = True
            self._canceller = None
        if self.cancelled:
            return
        if not final and len(self._items) >= self.limit:
            self._items.append((InferdError(
                ErrorCode.UNAVAILABLE,
                f"the response stream fell {self.limit} responses behind; the request was cancelled"), True))
            self._cancel_in_worker()
            self.ended = True
        else:
            self._items.append((item, final))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: InferdError) -> None:
        """End the request with `error` unless it has already ended."""
        self.put(error, True)

    def watch(self, future: asyncio.Future[Any]) -> None:
        """A scheduler future for the request: its failure (queue timeout, no instance, worker
        death...) ends the stream unless the worker already did."""
        future.add_done_callback(self._on_future_done)

    def _on_future_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self.fail(exc if isinstance(exc, InferdError) else InferdError(ErrorCode.INTERNAL, str(exc)))

    # ---- consumer side ----
    async def get(self) -> Item:
        """The next (response or error, final); waits for it."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def abandon(self, future: asyncio.Future[Any]) -> None:
        """The consumer left before the final item: the request is cancelled wherever it is (queued: it
        leaves its queue; running or streaming after its execute returned: its worker gets Cancel)."""
        if not future.done():
            future.cancel()
        self.cancel()

    def cancel(self) -> None:
        """The consumer is gone: drop what is buffered and ask the worker to cancel the request."""
        if self.cancelled:
            return
        self.cancelled = True
        self._items.clear()
        self._cancel_in_worker()

    def _cancel_in_worker(self) -> None:
        canceller, self._canceller = self._canceller, None
        if canceller is not None and not self.ended:
            canceller()
