"""A bounded FIFO that runners (one per instance) wait on; items can be put back at the front."""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkQueue(Generic[T]):
    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._items: collections.deque[T] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return self.max_size > 0 and len(self._items) >= self.max_size

    def put(self, item: T) -> None:
        self._items.append(item)
        self._wake_one()

    def put_front(self, item: T) -> None:
        self._items.appendleft(item)
        self._wake_one()

    def pop_nowait(self) -> T | None:
        return self._items.popleft() if self._items else None

    def remove(self, item: T) -> bool:
        """Take `item` out of the queue (O(n): cancellations are rare); False if it is not queued."""
        try:
            self._items.remove(item)
        except ValueError:
            return False
        return True

    def drain(self) -> list[T]:
        items = list(self._items)
        self._items.clear()
        return items

    async def wait_nonempty(self) -> None:
        while not self._items:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
