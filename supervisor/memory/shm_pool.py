"""Supervisor-owned shared-memory regions for input tensors too large to ride as ZeroMQ frames.

Regions are created with `wire.shm.create` from stems `inferd_<supervisor pid>_<n>` (posix_fallocate: a
full /dev/shm is InferdError(INTERNAL, "shared memory exhausted ...", as Triton words it), never a SIGBUS); their
names are handles (`<stem>.<fd>.<inode>`) to files already unlinked, so a kill -9 of the supervisor
leaves nothing in /dev/shm. "Unlink" below means: close the fd, so that no worker can attach any more. A region
holds one tensor at offset 0 and is reused across requests: sizes are rounded to classes (powers of
two from 128 KiB to 64 MiB, then multiples of 64 MiB), free regions are kept per class, the total is
bounded, and regions idle for `idle_s` are unlinked. Workers cache mappings by name, so every unlink
bumps `epoch`; a worker's next Execute lists the names it has seen that are no longer live
(`Execute.forget_regions`). Names are never reused. `close()` unlinks everything.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError

log = logging.getLogger("inferd.memory.shm")

MIN_CLASS = 128 * 1024
POW2_MAX_CLASS = 64 * 1024 * 1024


def size_class(nbytes: int) -> int:
    if nbytes <= MIN_CLASS:
        return MIN_CLASS
    if nbytes <= POW2_MAX_CLASS:
        return 1 << (nbytes - 1).bit_length()
    return -(-nbytes // POW2_MAX_CLASS) * POW2_MAX_CLASS


class _Entry:
    __slots__ = ("region", "size", "idle_since")

    def __init__(self, region: shm.Region, size: int) -> None:
        self.region = region
        self.size = size
        self.idle_since = 0.0


class ShmLease:
    """One tensor's place in the pool: write the bytes, reference (name, offset), release when answered."""

    __slots__ = ("_pool", "_entry", "name", "offset", "nbytes")

    def __init__(self, pool: ShmPool, entry: _Entry, nbytes: int) -> None:
        self._pool: ShmPool | None = pool
        self._entry = entry
        self.name = entry.region.name
        self.offset = 0
        self.nbytes = nbytes

    def write(self, data: Any) -> None:
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B") if view.c_contiguous else memoryview(bytes(view))
        if view.nbytes != self.nbytes:
            raise InferdError(ErrorCode.INTERNAL, "tensor size changed while copying to shared memory")
        buf = self._entry.region.buf
        assert buf is not None
        buf[self.offset : self.offset + self.nbytes] = view

    @property
    def buf(self) -> memoryview:
        buf = self._entry.region.buf
        assert buf is not None
        return buf[self.offset : self.offset + self.nbytes]

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._release(self._entry)


class ShmPool:
    def __init__(
        self, *, max_bytes: int = 1 << 30, idle_s: float = 30.0, owner_pid: int | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.owner_pid = os.getpid() if owner_pid is None else owner_pid
        self.epoch = 0  # bumped on every unlink (workers then forget dead names)
        self.total_bytes = 0
        self.in_use_bytes = 0
        self._entries: dict[str, _Entry] = {}
        self._free: dict[int, list[_Entry]] = {}
        self._counter = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @staticmethod
    def sweep_stale() -> list[str]:
        """Unlink our-prefix regions left by dead owners (a supervisor killed with -9). Call at start."""
        removed = shm.sweep_stale()
        if removed:
            log.info("removed %d stale shared-memory regions", len(removed))
        return removed

    # ---- queries ----
    def is_live(self, name: str) -> bool:
        return name in self._entries

    @property
    def region_count(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    # ---- leasing ----
    def lease(self, nbytes: int) -> ShmLease:
        if self._closed:
            raise InferdError(ErrorCode.UNAVAILABLE, "shared memory pool is closed")
        if nbytes <= 0:
            raise InferdError(ErrorCode.INVALID_ARG, "shared memory lease must be positive")
        size = size_class(nbytes)
        free = self._free.get(size)
        entry = free.pop() if free else self._create(size)
        self.in_use_bytes += size
        return ShmLease(self, entry, nbytes)

    def _create(self, size: int) -> _Entry:
        if self.total_bytes + size > self.max_bytes:
            self._evict(self.total_bytes + size - self.max_bytes)
            if self.total_bytes + size > self.max_bytes:
                raise InferdError(
                    ErrorCode.UNAVAILABLE,
                    f"shared memory exhausted: pool limit of {self.max_bytes} bytes reached"
                    f" ({self.in_use_bytes} bytes in use)",
                )
        stem = shm.make_name(self.owner_pid, str(next(self._counter)))
        region = shm.create(stem, size)  # InferdError(INTERNAL, "shared memory exhausted ...")
        entry = _Entry(region, size)
        self._entries[region.name] = entry
        self.total_bytes += size
        return entry

    def _release(self, entry: _Entry) -> None:
        self.in_use_bytes -= entry.size
        if self._closed or entry.region.name not in self._entries:
            return
        entry.idle_since = time.monotonic()
        self._free.setdefault(entry.size, []).append(entry)
        self._arm_timer()

    # ---- trimming ----
    def _evict(self, need: int) -> None:
        """Unlink free regions, least recently used first, until `need` bytes are freed (or none left)."""
        idle = sorted((e for lst in self._free.values() for e in lst), key=lambda e: e.idle_since)
        freed = 0
        for entry in idle:
            if freed >= need:
                break
            self._unlink(entry)
            freed += entry.size

    def trim(self, older_than_s: float | None = None) -> list[str]:
        """Unlink free regions idle for at least `older_than_s` (default idle_s); returns their names."""
        limit = time.monotonic() - (self.idle_s if older_than_s is None else older_than_s)
        gone = [e for lst in self._free.values() for e in lst if e.idle_since <= limit]
        for entry in gone:
            self._unlink(entry)
        return [e.region.name for e in gone]

    def _unlink(self, entry: _Entry) -> None:
        name = entry.region.name
        if self._entries.pop(name, None) is None:
            return
        lst = self._free.get(entry.size)
        if lst is not None and entry in lst:
            lst.remove(entry)
        entry.region.close()  # closes the fd: the region is gone once the workers drop their mappings
        self.total_bytes -= entry.size
        self.epoch += 1

    def _arm_timer(self) -> None:
        if self._timer is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self.idle_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.trim()
        if any(self._free.values()):
            self._arm_timer()

    # ---- shutdown ----
    def close(self) -> None:
        """Unlink every region (in use or not). Idempotent."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for entry in list(self._entries.values()):
            entry.region.close()
        if self._entries:
            self.epoch += 1
        self._entries.clear()
        self._free.clear()
        self.total_bytes = 0
