"""ClientShm against real /dev/shm objects: a region that shrinks is an error naming it (never a
SIGBUS), writes never grow a shrunk object back, and objects this process created or attached are
refused whatever name reaches them."""

from __future__ import annotations

import os
import uuid

import pytest
from inferd.supervisor.memory import client_shm
from inferd.supervisor.memory.client_shm import ClientShm
from inferd.supervisor.memory.shm_pool import ShmPool
from inferd.worker.wire import shm
from inferd.worker.wire.errors import ErrorCode, InferdError


@pytest.fixture
def obj():
    made: list[tuple[str, int]] = []

    def make(size: int, prefix: str = "cshm_") -> tuple[str, int]:
        key = prefix + uuid.uuid4().hex[:12]
        fd = os.open("/dev/shm/" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        made.append((key, fd))
        return key, fd

    yield make
    for key, fd in made:
        os.close(fd)
        if os.path.exists("/dev/shm/" + key):
            os.unlink("/dev/shm/" + key)


@pytest.fixture
def cs():
    c = ClientShm()
    yield c
    c.unregister("system")


def test_read_write_roundtrip_and_rewrites_seen(cs, obj):
    key, fd = obj(8192)
    cs.register("system", "r", key="/" + key, offset=4096, byte_size=4096)
    os.pwrite(fd, b"abcd", 4096)
    assert bytes(cs.read("r", 0, 4)) == b"abcd"
    os.pwrite(fd, b"wxyz", 4096)
    assert bytes(cs.read("r", 0, 4)) == b"wxyz"
    cs.write("r", 100, b"hello")
    assert os.pread(fd, 5, 4196) == b"hello"
    assert bytes(cs.read("r", 0, 0)) == b""


@pytest.mark.parametrize("new_size", [0, 4096, 4096 + 10])
def test_shrunk_region_is_an_error_naming_it(cs, obj, new_size):
    key, fd = obj(1 << 20)
    cs.register("system", "shrinking", key=key, offset=4096, byte_size=(1 << 20) - 4096)
    os.ftruncate(fd, new_size)
    with pytest.raises(InferdError) as exc:
        cs.read("shrinking", 0, (1 << 20) - 4096)
    assert exc.value.code == ErrorCode.INVALID_ARG and "'shrinking'" in exc.value.message
    assert "now %d bytes" % new_size in exc.value.message
    with pytest.raises(InferdError) as exc:
        cs.write("shrinking", 0, b"x" * 64)
    assert exc.value.code == ErrorCode.INVALID_ARG and "'shrinking'" in exc.value.message
    assert os.fstat(fd).st_size == new_size  # not grown back
    # a window that still lies inside the shorter object reads fine
    if new_size > 4096:
        assert len(cs.read("shrinking", 0, 10)) == 10


def test_vanished_key_keeps_working_until_unregistered(cs, obj):
    key, fd = obj(4096)
    cs.register("system", "v", key=key, byte_size=4096)
    os.unlink("/dev/shm/" + key)
    os.pwrite(fd, b"still", 0)
    assert bytes(cs.read("v", 0, 5)) == b"still"
    cs.unregister("system", "v")
    with pytest.raises(InferdError, match="Unable to find"):
        cs.read("v", 0, 5)


def test_server_objects_are_refused_by_identity(cs, obj):
    pool = ShmPool(owner_pid=os.getpid())
    lease = pool.lease(4096)
    alias = "alias_" + uuid.uuid4().hex[:8]
    try:
        os.link("/dev/shm/" + lease.name, "/dev/shm/" + alias)
        for key in (lease.name, "/" + alias):
            with pytest.raises(InferdError, match="created by this server") as exc:
                cs.register("system", "stolen", key=key, byte_size=4096)
            assert exc.value.code == ErrorCode.INVALID_ARG
        # a region another process created and this one attached, then renamed away from its name
        other = shm.make_name(1, "o" + uuid.uuid4().hex[:8])  # pid 1: not this process
        shm.create(other, 4096).close()
        attached = shm.attach(other, readonly=True)
        moved = "moved_" + uuid.uuid4().hex[:8]
        os.rename("/dev/shm/" + other, "/dev/shm/" + moved)
        try:
            with pytest.raises(InferdError, match="created by this server"):
                cs.register("system", "stolen", key=moved, byte_size=4096)
        finally:
            attached.close()
            os.unlink("/dev/shm/" + moved)
        assert cs.status("system") == []
    finally:
        lease.release()
        pool.close()
        if os.path.exists("/dev/shm/" + alias):
            os.unlink("/dev/shm/" + alias)
    # a client's own object, even named like ours, is accepted
    key, _ = obj(4096, prefix="inferd_test_")
    cs.register("system", "mine", key=key, byte_size=4096)


def test_registered_regions_are_bounded(cs, obj, monkeypatch):
    monkeypatch.setattr(client_shm, "MAX_SYSTEM_REGIONS", 3)
    key, _ = obj(4096)
    for i in range(3):
        cs.register("system", "r%d" % i, key=key, byte_size=16)
    with pytest.raises(InferdError, match="limit"):
        cs.register("system", "r3", key=key, byte_size=16)
    cs.unregister("system", "r0")
    cs.register("system", "r3", key=key, byte_size=16)
