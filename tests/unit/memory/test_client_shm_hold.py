"""Regions held by requests in flight and Triton's bounds checks (memory/client_shm.py; issue 43 item 10),
against real /dev/shm objects and the fake CUDA device (the CUDA path's code without a GPU)."""

from __future__ import annotations

import gc
import os
import uuid

import pytest
from inferd.supervisor.memory.client_shm import ClientShm, check_window
from inferd.supervisor.memory.cuda_regions import CudaRegions
from inferd.worker.wire.errors import ErrorCode, InferdError

from .fake_cuda_device import FakeDevice

IN_USE = "Cannot unregister shared memory region '%s', it is currently in use."


@pytest.fixture
def cs():
    keys = []
    dev = FakeDevice()
    c = ClientShm(cuda=CudaRegions(lambda: dev), cuda_probe=True)
    c.dev = dev  # type: ignore[attr-defined]

    def region(name: str, size: int = 64) -> None:
        key = "hold_" + uuid.uuid4().hex[:12]
        fd = os.open("/dev/shm/" + key, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        keys.append(key)
        c.register("system", name, key=key, offset=0, byte_size=size)

    c.region = region  # type: ignore[attr-defined]
    yield c
    c.unregister("system", held_too=True)
    for key in keys:
        os.unlink("/dev/shm/" + key)


def test_a_held_region_is_refused_with_tritons_words(cs):
    cs.region("a")
    cs.region("b")
    hold = cs.hold(["a", "a", "unknown"])
    assert hold is not None and hold.names == ("a",)
    with pytest.raises(InferdError) as info:
        cs.unregister("system", "a")
    assert info.value.message == IN_USE % "a" and info.value.code == ErrorCode.INTERNAL
    cs.unregister("system", "b")  # another region is free
    assert [r["name"] for r in cs.status("system")] == ["a"]
    hold.release()
    hold.release()  # (once only)
    cs.unregister("system", "a")
    assert cs.status("system") == [] and cs.users == {}


def test_unregister_all_removes_the_free_ones_and_names_the_held(cs):
    for name in ("c", "a", "b", "free"):
        cs.region(name)
    first, second = cs.hold(["c", "a"]), cs.hold(["b", "a"])
    with pytest.raises(InferdError) as info:
        cs.unregister("system")
    assert info.value.message == "Failed to unregister the following system shared memory regions: a ,b ,c ,"
    assert sorted(r["name"] for r in cs.status("system")) == ["a", "b", "c"]
    first.release()
    with pytest.raises(InferdError, match="regions: a ,b ,$"):  # "a" is still held by the second request
        cs.unregister("system")
    del second
    gc.collect()  # a hold dropped without release lets go when collected
    cs.unregister("system")
    assert cs.status("system") == []


def test_a_frontend_follows_the_core_even_while_held(cs):
    cs.region("a")
    hold = cs.hold(["a"])
    cs.unregister("system", "a", held_too=True)
    assert cs.status("system") == []
    hold.release()
    assert cs.users == {}


def test_cuda_regions_are_held_too(cs):
    cs.register("cuda", "g", raw_handle=cs.dev.allocate(128), device_id=0, byte_size=128)
    hold = cs.hold(["g"])
    with pytest.raises(InferdError, match=r"Cannot unregister shared memory region 'g', it is currently in use\."):
        cs.unregister("cuda", "g")
    with pytest.raises(InferdError, match="Failed to unregister the following cuda shared memory regions: g ,$"):
        cs.unregister("cuda")
    assert [r["name"] for r in cs.status("cuda")] == ["g"]
    hold.release()
    cs.unregister("cuda")
    assert cs.status("cuda") == []


@pytest.mark.parametrize("offset,size,message", [
    (64, 1, "Invalid offset for shared memory region: 'r'"),
    (2**64 - 32, 64, "Invalid offset for shared memory region: 'r'"),  # HTTP: a negative number's 64-bit wrap
    (-32, 64, "Invalid offset for shared memory region: 'r'"),  # gRPC's int64, read unsigned as Triton reads it
    (60, 8, "Invalid offset + byte size for shared memory region: 'r'"),
    (8, 2**64 - 8, "Invalid offset + byte size for shared memory region: 'r'"),  # no wrap to 0
    (0, -1, "Invalid offset + byte size for shared memory region: 'r'"),
])
def test_windows_out_of_bounds(cs, offset, size, message):
    with pytest.raises(InferdError) as info:
        check_window("r", 64, offset, size)
    assert info.value.message == message and info.value.code == ErrorCode.INVALID_ARG
    cs.region("r")
    with pytest.raises(InferdError) as info:
        cs.check("r", offset, size)
    assert info.value.message == message
    with pytest.raises(InferdError, match="Unable to find shared memory region: 'nope'") as info:
        cs.check("nope", 0, 1)
    assert info.value.code == ErrorCode.NOT_FOUND


@pytest.mark.parametrize("offset,size", [(0, 64), (63, 1), (0, 0), (32, 32)])
def test_windows_in_bounds(cs, offset, size):
    check_window("r", 64, offset, size)
    cs.region("r")
    cs.check("r", offset, size)
    assert len(cs.read("r", offset, size)) == size


def test_status_of_an_unknown_region_is_not_found(cs):
    with pytest.raises(InferdError) as info:
        cs.status("system", "nope")
    assert info.value.code == ErrorCode.NOT_FOUND
    assert info.value.message == "Unable to find system shared memory region: 'nope'"
