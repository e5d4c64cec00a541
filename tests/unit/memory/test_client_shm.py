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


def test_a_tensor_naming_an_unknown_region_is_not_found(cs):
    """Triton 2.51 answers 404 / NOT_FOUND here (inferd answered 400; found by the differential test)."""
    for call in (lambda: cs.read("nope", 0, 4), lambda: cs.write("nope", 0, b"abcd")):
        with pytest.raises(InferdError) as exc:
            call()
        assert exc.value.code == ErrorCode.NOT_FOUND
        assert exc.value.message == "Unable to find shared memory region: 'nope'"


def test_server_regions_cannot_be_named(cs):
    """Regions the server creates are unlinked at once and cannot be linked back under any name."""
    pool = ShmPool(owner_pid=os.getpid())
    lease = pool.lease(4096)
    alias = "alias_" + uuid.uuid4().hex[:8]
    try:
        fd = int(lease.name.rsplit(".", 2)[1])
        with pytest.raises(OSError):  # ENOENT (nlink 0, not O_TMPFILE), or EXDEV in some sandboxes
            os.link("/proc/self/fd/%d" % fd, "/dev/shm/" + alias, follow_symlinks=True)
        for key in (lease.name, shm.stem(lease.name)):
            with pytest.raises(InferdError, match="Unable to open") as exc:
                cs.register("system", "stolen", key=key, byte_size=4096)
            assert exc.value.code == ErrorCode.INVALID_ARG
    finally:
        lease.release()
        pool.close()


def test_objects_this_process_maps_are_refused_by_identity(cs, obj):
    # a named region (as another process's region is in the instant between its creation and unlink,
    # or one made by an older version) that this process attached: refused by any name that reaches it
    stem = shm.make_name(1, "o" + uuid.uuid4().hex[:8])  # pid 1: not this process
    with open("/dev/shm/" + stem, "xb") as f:
        f.write(bytes(4096))
    attached = shm.attach(stem, readonly=True)
    alias, moved = "alias_" + uuid.uuid4().hex[:8], "moved_" + uuid.uuid4().hex[:8]
    try:
        os.link("/dev/shm/" + stem, "/dev/shm/" + alias)
        for key in (stem, alias):
            with pytest.raises(InferdError, match="created by this server") as exc:
                cs.register("system", "stolen", key=key, byte_size=4096)
            assert exc.value.code == ErrorCode.INVALID_ARG
        os.unlink("/dev/shm/" + alias)
        os.rename("/dev/shm/" + stem, "/dev/shm/" + moved)
        with pytest.raises(InferdError, match="created by this server"):
            cs.register("system", "stolen", key=moved, byte_size=4096)
        assert cs.status("system") == []
    finally:
        attached.close()
        for n in (stem, alias, moved):
            if os.path.exists("/dev/shm/" + n):
                os.unlink("/dev/shm/" + n)


def test_named_regions_of_a_live_inferd_process_are_refused(cs):
    # not mapped here, but named for a live owner (a worker's region in the instant before its unlink)
    stem = shm.make_name(os.getppid(), "w" + uuid.uuid4().hex[:8])
    alias = "alias_" + uuid.uuid4().hex[:8]
    with open("/dev/shm/" + stem, "xb") as f:
        f.write(bytes(4096))
    try:
        os.link("/dev/shm/" + stem, "/dev/shm/" + alias)
        with pytest.raises(InferdError, match="created by this server"):
            cs.register("system", "stolen", key=alias, byte_size=4096)
    finally:
        for n in (stem, alias):
            os.unlink("/dev/shm/" + n)


def test_a_clients_own_object_is_accepted_even_named_like_ours(cs, obj):
    key, _ = obj(4096, prefix="inferd_test_")
    cs.register("system", "mine", key=key, byte_size=4096)
    assert [r["name"] for r in cs.status("system")] == ["mine"]


def test_registered_regions_are_bounded(cs, obj, monkeypatch):
    monkeypatch.setattr(client_shm, "MAX_SYSTEM_REGIONS", 3)
    key, _ = obj(4096)
    for i in range(3):
        cs.register("system", "r%d" % i, key=key, byte_size=16)
    with pytest.raises(InferdError, match="limit"):
        cs.register("system", "r3", key=key, byte_size=16)
    cs.unregister("system", "r0")
    cs.register("system", "r3", key=key, byte_size=16)
