"""The lifecycle the default scheduler, the dynamic batcher and the sequence batcher share: started once
every instance has started, refusing requests once closed or with no ready instance, draining (bounded)
on unload and failing what is still queued on close. Each subclass keeps its own queue and dispatching."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from inferd.worker.wire.errors import ErrorCode, InferdError

from .base import Executor


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
