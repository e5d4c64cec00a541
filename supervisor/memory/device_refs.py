"""Who holds which device tensor: reference counts of workers' GPU outputs shared by CUDA IPC.

A worker that answers with a device tensor (TensorRef loc "cuda") keeps the memory until the
supervisor says every holder is done. The supervisor never touches the memory: it only counts.
Each holder -- the response a scheduler passes on, a consumer worker's request, a BLS caller's
lease -- holds one `DeviceShare`; a share is released explicitly or when it is garbage collected
(the Tensor that carried it is gone), so a consumer that dies releases its share with its requests.
When the last share of an allocation goes, the allocator is told to free it (the producer worker
gets a release message). A producer that dies makes its allocations dead: every later use of a
share raises an error naming it, and nothing is sent to it.

The allocator is a small interface so this bookkeeping is tested on a CPU with a fake one.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from inferd.worker.wire.errors import ErrorCode, InferdError


class DeviceAllocator(Protocol):
    """The producer side: `free(owner, key)` lets owner's worker drop the allocation known as `key`."""

    def free(self, owner: str, key: str) -> None: ...


class _Allocation:
    __slots__ = ("owner", "key", "label", "notify", "count", "dead")

    def __init__(self, owner: str, key: str, label: str, notify: bool) -> None:
        self.owner = owner  # the producer process (the supervisor's worker identity)
        self.key = key
        self.label = label or owner  # how errors name the producer (its instance name)
        self.notify = notify  # tell the producer when the last share goes (False: it keeps the memory anyway)
        self.count = 0
        self.dead = False


class DeviceShare:
    """One holder's claim on a producer's device allocation (released once, explicitly or by GC)."""

    __slots__ = ("_table", "_alloc", "_finalizer", "__weakref__")

    def __init__(self, table: DeviceRefs, alloc: _Allocation) -> None:
        self._table = table
        self._alloc = alloc
        # runs once: on `release`, or when the share is collected
        self._finalizer = weakref.finalize(self, table._drop, alloc)

    @property
    def owner(self) -> str:
        return self._alloc.owner

    @property
    def key(self) -> str:
        return self._alloc.key

    @property
    def label(self) -> str:
        return self._alloc.label

    @property
    def alive(self) -> bool:
        return not self._alloc.dead

    def check(self) -> None:
        """InferdError (UNAVAILABLE) naming the producer when its memory is gone."""
        if self._alloc.dead:
            raise InferdError(ErrorCode.UNAVAILABLE,
                              "device tensor memory of instance '%s' is gone: the instance died" % self._alloc.label)

    def share(self) -> DeviceShare:
        """Another share of the same allocation (a new holder)."""
        self.check()
        return self._table._new_share(self._alloc)

    def release(self) -> None:
        self._finalizer()


class DeviceRefs:
    """The reference counts, per (owner, key). Thread-safe: shares may be collected on any thread."""

    def __init__(self, allocator: DeviceAllocator) -> None:
        self._allocator = allocator
        self._allocs: dict[tuple[str, str], _Allocation] = {}
        self._lock = threading.Lock()

    def register(self, owner: str, key: str, label: str = "", notify: bool = True) -> DeviceShare:
        """A producer's new output (or another reference to one it already shares): the first share.
        `notify` False: the producer keeps the memory for its own reasons (a BLS caller's input, held
        for the call) and is not told when the shares are gone."""
        with self._lock:
            alloc = self._allocs.get((owner, key))
            if alloc is None:
                alloc = self._allocs[(owner, key)] = _Allocation(owner, key, label, notify)
            alloc.count += 1
        return DeviceShare(self, alloc)

    def find(self, owner_label: str, key: str) -> DeviceShare | None:
        """A new share of a live allocation known by its producer's label and key (a consumer handing
        back memory it was given), or None."""
        with self._lock:
            for alloc in self._allocs.values():
                if alloc.key == key and alloc.label == owner_label and not alloc.dead:
                    alloc.count += 1
                    break
            else:
                return None
        return DeviceShare(self, alloc)

    def _new_share(self, alloc: _Allocation) -> DeviceShare:
        with self._lock:
            alloc.count += 1
        return DeviceShare(self, alloc)

    def _drop(self, alloc: _Allocation) -> None:
        free = False
        with self._lock:
            alloc.count -= 1
            if alloc.count <= 0 and self._allocs.get((alloc.owner, alloc.key)) is alloc:
                del self._allocs[(alloc.owner, alloc.key)]
                free = alloc.notify and not alloc.dead
        if free:
            self._allocator.free(alloc.owner, alloc.key)

    def producer_died(self, owner: str) -> int:
        """`owner`'s memory is gone: its allocations become dead (shares fail `check`, nothing is freed
        through it). Returns how many allocations were still held."""
        with self._lock:
            held = [a for a in self._allocs.values() if a.owner == owner]
            for alloc in held:
                alloc.dead = True
                del self._allocs[(alloc.owner, alloc.key)]
        return len(held)

    def held(self, owner: str | None = None) -> int:
        """Allocations with live shares (of `owner`, or of everyone)."""
        with self._lock:
            return sum(1 for a in self._allocs.values() if owner is None or a.owner == owner)

    def count(self, owner: str, key: str) -> int:
        with self._lock:
            alloc = self._allocs.get((owner, key))
            return alloc.count if alloc is not None else 0


class DeviceRef:
    """Where a device tensor the supervisor passes on lives, and the share that keeps it there."""

    __slots__ = ("share", "region", "offset", "nbytes", "device")

    def __init__(self, share: DeviceShare, region: str, offset: int, nbytes: int, device: int) -> None:
        self.share = share
        self.region = region  # the hex cudaIpcMemHandle
        self.offset = offset
        self.nbytes = nbytes
        self.device = device

    def key(self) -> str:
        return device_key(self.region, self.offset)


def device_key(region: str, offset: int) -> str:
    """The producer's name for one handed-out tensor (worker/device.py `ref_key`)."""
    return "%s:%d" % (region, offset)


class WorkerAllocator:
    """The real allocator: each producer worker registers how to send it a release."""

    def __init__(self) -> None:
        self._senders: dict[str, Callable[[list[str]], None]] = {}

    def attach(self, owner: str, send: Callable[[list[str]], None]) -> None:
        self._senders[owner] = send

    def detach(self, owner: str) -> None:
        self._senders.pop(owner, None)


    def free(self, owner: str, key: str) -> None:
        send = self._senders.get(owner)
        if send is not None:
            send([key])


# The server's one table (a supervisor process serves one repository): workers attach to ALLOCATOR as
# they start and are declared dead in TABLE when they exit.
ALLOCATOR = WorkerAllocator()
TABLE = DeviceRefs(ALLOCATOR)
