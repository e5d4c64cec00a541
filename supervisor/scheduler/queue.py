"""Request queues: the default scheduler's bounded FIFO and the per-priority-level queue of the dynamic
batcher."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkQueue(Generic[T]):
    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        # public: the default scheduler tests and takes from it directly (no Python call per check)
        self.items: collections.deque[T] = collections.deque()

    def __len__(self) -> int:
        return len(self.items)

    def full(self) -> bool:
        return self.max_size > 0 and len(self.items) >= self.max_size

    def put(self, item: T) -> None:
        self.items.append(item)

    def pop_nowait(self) -> T | None:
        return self.items.popleft() if self.items else None

    def remove(self, item: T) -> bool:
        """Take `item` out of the queue (O(n): cancellations are rare); False if it is not queued."""
        try:
            self.items.remove(item)
        except ValueError:
            return False
        return True

    def drain(self) -> list[T]:
        items = list(self.items)
        self.items.clear()
        return items


class PriorityQueue(Generic[T]):
    """One FIFO per priority level (index 0 = level 1, served first); within a level, requests whose
    queue timeout expired with the DELAY action wait behind the others (Triton's delayed queue).
    Iteration yields the serving order; a batch is always a prefix of it (`pop_front`)."""

    def __init__(self, max_sizes: list[int]) -> None:
        self.max_sizes = max_sizes  # per level, 0 = unbounded
        self._fresh: list[collections.deque[T]] = [collections.deque() for _ in max_sizes]
        self._delayed: list[collections.deque[T]] = [collections.deque() for _ in max_sizes]
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        for fresh, delayed in zip(self._fresh, self._delayed):
            yield from fresh
            yield from delayed

    def level_size(self, level: int) -> int:
        return len(self._fresh[level]) + len(self._delayed[level])

    def full(self, level: int) -> bool:
        limit = self.max_sizes[level]
        return limit > 0 and self.level_size(level) >= limit

    def put(self, level: int, item: T) -> None:
        self._fresh[level].append(item)
        self._count += 1

    def first(self) -> T | None:
        for fresh, delayed in zip(self._fresh, self._delayed):
            if fresh:
                return fresh[0]
            if delayed:
                return delayed[0]
        return None

    def delay(self, level: int, item: T) -> bool:
        """Move a queued request behind the level's non-expired ones; False if it is not queued."""
        try:
            self._fresh[level].remove(item)
        except ValueError:
            return False
        self._delayed[level].append(item)
        return True

    def remove(self, level: int, item: T) -> bool:
        """Take `item` out (O(n): cancellations and timeouts are rare); False if it is not queued."""
        for dq in (self._fresh[level], self._delayed[level]):
            try:
                dq.remove(item)
            except ValueError:
                continue
            self._count -= 1
            return True
        return False

    def pop_front(self, n: int) -> list[T]:
        """The first `n` items in serving order, removed."""
        out: list[T] = []
        for dq in (d for pair in zip(self._fresh, self._delayed) for d in pair):
            while dq and len(out) < n:
                out.append(dq.popleft())
            if len(out) == n:
                break
        self._count -= len(out)
        return out

    def drain(self) -> list[T]:
        items = list(self)
        for dq in (*self._fresh, *self._delayed):
            dq.clear()
        self._count = 0
        return items
