"""The event loop a Python model instance's coroutines run on (one thread, started on first use), as
Triton's stub keeps one: `async def` hooks are awaited to completion (`run`), except a decoupled
model's `execute`, which runs in the background (`start`) so that the next batch is taken at once and
several requests' executions proceed concurrently (Triton 2.51: `RunCoroutine(..., in_background)`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, Optional


class ModelLoop:
    def __init__(self, new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop) -> None:
        """`new_loop`: makes the loop on first use (the vllm backend runs vLLM on uvloop, as vLLM's server)."""
        self._new_loop = new_loop
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._background: set[concurrent.futures.Future[Any]] = set()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = self._new_loop()
                thread = threading.Thread(target=loop.run_forever, name="inferd-model-loop", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, awaitable: Any, poll: Optional[Callable[[], None]] = None) -> Any:
        """Await on the loop and return the result; `poll` is called while waiting (cancellation probes)."""
        future = self._submit(awaitable)
        if poll is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=0.02)
            except concurrent.futures.TimeoutError:
                poll()

    def start(self, awaitable: Any, done: Callable[[concurrent.futures.Future[Any]], None]) -> None:
        """Run in the background; `done(future)` is called (on the loop thread) when it ends."""
        future = self._submit(awaitable)
        with self._lock:
            self._background.add(future)

        def finished(fut: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._background.discard(fut)
            done(fut)

        future.add_done_callback(finished)

    def drain(self) -> None:
        """Wait for the background coroutines (before finalize: their requests are still open)."""
        with self._lock:
            pending = list(self._background)
        if pending:
            concurrent.futures.wait(pending)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._loop = None

    def _submit(self, awaitable: Any) -> concurrent.futures.Future[Any]:
        loop = self._ensure()
        if not asyncio.iscoroutine(awaitable):
            awaitable = _await(awaitable)
        return asyncio.run_coroutine_threadsafe(awaitable, loop)


def is_awaitable(value: Any) -> bool:
    if type(value) is list or value is None:  # what execute usually returns: skip the hasattr probe
        return False
    return type(value).__name__ == "coroutine" or hasattr(value, "__await__")


async def _await(awaitable: Any) -> Any:
    return await awaitable
