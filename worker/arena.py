"""Shared-memory regions a worker owns for tensors it hands to others (BLS inputs, large outputs).

One tensor per region, regions reused per size class (powers of two from 128 KiB), made from stems
`inferd_<worker pid>_<tag><n>` (handles to unlinked files, wire/shm.py: they vanish with the worker,
even on kill -9); the total is bounded.
`put` copies a tensor into a free region and marks it busy until `give_back`. Thread-safe.

Runs on Python 3.9+ (stdlib + the wire package only).
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, Optional

from .wire import shm
from .wire.errors import ErrorCode, InferdError

MIN_CLASS = 128 * 1024


def size_class(nbytes: int) -> int:
    return MIN_CLASS if nbytes <= MIN_CLASS else 1 << (nbytes - 1).bit_length()


class Arena:
    def __init__(self, tag: str, max_bytes: int = 1 << 30) -> None:
        self.tag = tag
        self.max_bytes = max_bytes
        self._free: dict[int, list[shm.Region]] = collections.defaultdict(list)
        self._all: dict[str, shm.Region] = {}
        self._busy: set[str] = set()
        self._bytes = 0
        self._names = itertools.count()
        self._lock = threading.Lock()

    def put(self, data: memoryview, copy: Optional[Callable[[Any, memoryview], None]] = None) -> shm.Region:
        """A busy region holding `data` at offset 0 (written by `copy(region.buf, data)` if given);
        InferdError(UNAVAILABLE) when the bound is reached."""
        region = self.take(data.nbytes)
        if region is None:
            raise InferdError(ErrorCode.UNAVAILABLE, "worker shared memory exhausted (%d bytes in use)"
                              % self._bytes)
        if copy is not None:
            copy(region.buf, data)
        else:
            region.buf[: data.nbytes] = data
        return region

    def take(self, nbytes: int) -> Optional[shm.Region]:
        """A busy region of at least `nbytes`, or None when the bound would be exceeded."""
        size = size_class(nbytes)
        with self._lock:
            free = self._free[size]
            region = free.pop() if free else None
            if region is None:
                if self._bytes + size > self.max_bytes:
                    self._evict_idle(self._bytes + size - self.max_bytes)
                if self._bytes + size > self.max_bytes:
                    return None
                region = shm.create(shm.make_name(os.getpid(), "%s%d" % (self.tag, next(self._names))), size)
                self._all[region.name] = region
                self._bytes += size
            self._busy.add(region.name)
        return region

    def _evict_idle(self, wanted: int) -> None:
        """Close idle regions of other size classes (largest first) until `wanted` bytes are freed:
        a large tensor after smaller ones must not find the bound taken by regions nobody uses."""
        idle = sorted((r for regions in self._free.values() for r in regions), key=lambda r: -r.size)
        for region in idle:
            if wanted <= 0:
                return
            self._free[region.size].remove(region)
            del self._all[region.name]
            self._bytes -= region.size
            wanted -= region.size
            region.close()

    def give_back(self, regions: Iterable[shm.Region]) -> None:
        self.give_back_names(region.name for region in regions)

    def give_back_names(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                if name in self._busy:  # unknown or already free names are ignored (a confused peer)
                    self._busy.discard(name)
                    region = self._all[name]
                    self._free[region.size].append(region)

    def close(self) -> None:
        with self._lock:
            for region in self._all.values():
                region.close()  # closes the fd: the region is gone once its readers drop their mappings
            self._all.clear()
            self._free.clear()
            self._busy.clear()
