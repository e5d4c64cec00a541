"""What a scheduler needs from an instance (Executor) and what the core needs from a scheduler
(Scheduler): kept tiny so that the default scheduler, the dynamic batcher and the sequence batcher
share one shape (instances.instance.Instance is an Executor)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..inference.types import InferRequest, InferResponse


class Executor(Protocol):
    """One model instance as the scheduler sees it."""

    name: str

    @property
    def ready(self) -> bool: ...

    async def execute(self, requests: list[InferRequest]) -> Any:
        """A BatchResult: .responses (InferResponse | InferdError per request) and compute_*_ns."""

    def launch(self, requests: list[InferRequest], on_free: Callable[[], None] | None = None) -> asyncio.Future[Any]:
        """`execute` as a future, the batch sent before it returns when the instance has room (the
        callback path of the default and dynamic schedulers: no task per batch). Raises InferdError
        when the instance cannot take it; cancelling the future cancels the batch. `on_free()` is
        called (once, at most) as the answer arrives, before it is read and the future resolved, so
        that the scheduler can send the next batch first; an instance may also never call it."""

    def cancel(self, requests: Iterable[InferRequest]) -> None:
        """Tell the worker that these requests (in flight on this instance) are cancelled."""


class Scheduler(Protocol):
    """A model version's request queue(s) and the runners that feed its instances."""

    def start(self) -> None:
        """Start serving (called once every instance has started)."""

    def instance_changed(self, executor: Executor) -> None:
        """An instance's readiness may have changed."""

    @property
    def pending_count(self) -> int:
        """Requests waiting in the queue(s) (not yet handed to an instance)."""

    @property
    def idle(self) -> bool:
        """Nothing queued or running (the busy poller asks it of each request's model)."""

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Queue one request; raises InferdError (UNAVAILABLE, INVALID_ARG) when it cannot be queued.
        The response carries the model's name and version and the request's id.
        Cancelling the returned future cancels the request (dropped from the queue, or Cancel sent to
        the worker running it)."""

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; wait (bounded) until queued and running ones are answered."""

    async def close(self) -> None:
        """Stop the runners; fail what is still queued with UNAVAILABLE."""
