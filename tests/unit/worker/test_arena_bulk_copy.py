"""worker/arena.py makes room for a large tensor by closing idle regions of other size classes, and
worker/bulk_copy.py keeps the bytes (issue 28 item 8)."""

from __future__ import annotations

import mmap

import numpy as np
from inferd.worker import bulk_copy
from inferd.worker.arena import Arena


def test_idle_regions_make_room_for_a_larger_class():
    arena = Arena("t", max_bytes=4 << 20)
    small = [arena.put(memoryview(bytes(1 << 20))) for _ in range(3)]  # three 1 MiB regions
    arena.give_back(small)
    big = arena.take(4 << 20)  # needs all 4 MiB: the idle ones go
    assert big is not None and big.size == 4 << 20
    assert arena.take(1 << 20) is None  # the busy one is kept
    arena.close()


def test_busy_regions_are_never_evicted():
    arena = Arena("u", max_bytes=2 << 20)
    held = arena.put(memoryview(bytes(1 << 20)))
    assert arena.take(2 << 20) is None
    assert not held.closed
    arena.close()


def test_copies_keep_the_bytes():
    """(That they leave the GIL free is what tests/e2e/test_bls_large.py shows: a worker copying 300 MiB
    with the GIL held misses heartbeats and is killed.)"""
    for n in (3, bulk_copy.SMALL - 1, 8 << 20):
        src = (np.arange(n, dtype=np.uint32) % 251).astype(np.uint8)
        dst = mmap.mmap(-1, n)
        bulk_copy.copy_into(memoryview(dst), memoryview(src))
        assert np.array_equal(np.frombuffer(dst, np.uint8), src)
        copy = bulk_copy.private_copy(memoryview(dst))
        assert copy.nbytes == n and np.array_equal(np.frombuffer(copy, np.uint8), src)
        assert not copy.readonly
