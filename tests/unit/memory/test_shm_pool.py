"""ShmPool: size classes, reuse, bounds, idle trimming, close, stale sweep."""

from __future__ import annotations

import os
import subprocess

import pytest
from inferd.supervisor.memory.shm_pool import MIN_CLASS, ShmPool, size_class
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError


def ours(pid: int | None = None) -> list[str]:
    """Names under /dev/shm of regions `pid` created (the pool's are unlinked at creation: none)."""
    prefix = f"inferd_{pid or os.getpid()}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def held() -> list[str]:
    """Handles of the regions this process keeps open (its fds on unlinked /dev/shm files)."""
    prefix = f"/dev/shm/inferd_{os.getpid()}_"
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith(" (deleted)"):
            names.append(target[len("/dev/shm/"): -len(" (deleted)")])
    return sorted(set(names))  # mmap keeps a dup of the fd: each region is open twice


@pytest.fixture
def pool():
    p = ShmPool(max_bytes=8 << 20, idle_s=60)
    yield p
    p.close()
    assert ours() == [] and held() == []


def test_size_class():
    assert size_class(1) == MIN_CLASS
    assert size_class(MIN_CLASS + 1) == 2 * MIN_CLASS
    assert size_class(1 << 20) == 1 << 20
    assert size_class((64 << 20) + 1) == 128 << 20
    assert size_class(200 << 20) == 256 << 20


def test_lease_write_reuse(pool):
    a = pool.lease(200_000)
    a.write(b"x" * 200_000)
    assert bytes(a.buf[:3]) == b"xxx" and a.name.startswith(f"inferd_{os.getpid()}_")
    assert pool.in_use_bytes == 256 * 1024 and held() == [a.name] and ours() == []
    name = a.name
    a.release()
    a.release()  # idempotent
    assert pool.in_use_bytes == 0
    b = pool.lease(150_000)
    assert b.name == name  # reused
    c = pool.lease(150_000)
    assert c.name != name and pool.region_count == 2
    b.release()
    c.release()


def test_write_checks_size_and_casts(pool):
    import numpy as np

    lease = pool.lease(400_000)
    arr = np.arange(100_000, dtype=np.float32)
    lease.write(memoryview(arr))  # format "f" is cast to bytes
    assert np.array_equal(np.frombuffer(lease.buf, np.float32), arr)
    with pytest.raises(InferdError):
        lease.write(b"short")
    lease.release()


def test_limit_evicts_idle_then_refuses(pool):
    leases = [pool.lease(2 << 20) for _ in range(4)]  # 4 x 2 MiB = the 8 MiB limit
    with pytest.raises(InferdError, match="shared memory exhausted") as info:
        pool.lease(1 << 20)
    assert info.value.code == ErrorCode.UNAVAILABLE
    epoch = pool.epoch
    leases[0].release()
    gone = leases[0].name
    small = pool.lease(1 << 20)  # evicts the idle 2 MiB region
    assert not pool.is_live(gone) and pool.epoch > epoch and gone not in held()
    for lease in [small, *leases[1:]]:
        lease.release()


def test_trim_idle(pool):
    a = pool.lease(300_000)
    name = a.name
    a.release()
    assert pool.trim(older_than_s=3600) == []
    assert pool.trim(older_than_s=0) == [name]
    assert not pool.is_live(name) and held() == [] and pool.total_bytes == 0


def test_close_unlinks_in_use_regions():
    p = ShmPool()
    p.lease(100_000)
    p.lease(100_000)
    assert len(held()) == 2 and ours() == []
    p.close()
    assert held() == []
    with pytest.raises(InferdError):
        p.lease(10)


def test_sweep_stale_removes_dead_owners_only():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = shm.make_name(dead.pid, "0")  # as a kill -9 between create and unlink leaves it
    with open("/dev/shm/" + name, "xb") as f:
        f.write(bytes(4096))
    mine = ShmPool()
    lease = mine.lease(100_000)
    try:
        removed = ShmPool.sweep_stale()
        assert name in removed and ours(dead.pid) == []
        assert mine.is_live(lease.name) and held() == [lease.name]
    finally:
        shm.unlink(name)
        mine.close()
