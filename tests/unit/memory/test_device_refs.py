"""Reference counting of device tensors shared between workers (supervisor/memory/device_refs.py),
with a fake allocator standing in for the producer workers, and the worker-side handle cache of
wire/cuda_ipc.py with a fake CUDA runtime."""

import gc
import threading

import pytest
from inferd.supervisor.memory.device_refs import DeviceRefs, WorkerAllocator
from inferd.worker.wire import cuda_ipc
from inferd.worker.wire.errors import ErrorCode, InferdError


class FakeAllocator:
    def __init__(self) -> None:
        self.freed: list[tuple[str, str]] = []

    def free(self, owner: str, key: str) -> None:
        self.freed.append((owner, key))


def test_freed_only_after_every_consumer_released() -> None:
    alloc = FakeAllocator()
    table = DeviceRefs(alloc)
    first = table.register("producer_0", "h:0")
    consumers = [first.share() for _ in range(3)]
    assert table.count("producer_0", "h:0") == 4
    first.release()
    first.release()  # twice is once
    for share in consumers[:2]:
        share.release()
    assert alloc.freed == []
    consumers[2].release()
    assert alloc.freed == [("producer_0", "h:0")]
    assert table.held() == 0


def test_collected_share_releases_like_a_dead_consumer() -> None:
    alloc = FakeAllocator()
    table = DeviceRefs(alloc)
    share = table.register("p", "k")
    consumer = share.share()  # e.g. held by a consumer worker's in-flight request
    share.release()
    del consumer  # the consumer died: its request (and the tensor holding the share) is dropped
    gc.collect()
    assert alloc.freed == [("p", "k")]


def test_same_key_registered_twice_needs_both_released() -> None:
    alloc = FakeAllocator()
    table = DeviceRefs(alloc)
    a = table.register("p", "k")
    b = table.register("p", "k")  # the same output returned twice
    a.release()
    assert alloc.freed == []
    b.release()
    assert alloc.freed == [("p", "k")]


def test_producer_death_fails_later_uses_and_frees_nothing() -> None:
    alloc = FakeAllocator()
    table = DeviceRefs(alloc)
    share = table.register("gpu_model_0", "k1")
    held = share.share()
    other = table.register("other_0", "k2")
    assert table.producer_died("gpu_model_0") == 1
    with pytest.raises(InferdError) as err:
        held.check()
    assert err.value.code == ErrorCode.UNAVAILABLE and "gpu_model_0" in err.value.message
    with pytest.raises(InferdError, match="gpu_model_0"):
        held.share()
    share.release()
    held.release()
    assert alloc.freed == []  # nothing is sent to a dead worker
    other.check()  # other producers are untouched
    other.release()
    assert alloc.freed == [("other_0", "k2")]


def test_restarted_producer_under_same_name_is_alive() -> None:
    alloc = FakeAllocator()
    table = DeviceRefs(alloc)
    old = table.register("m_0", "k")
    table.producer_died("m_0")
    new = table.register("m_0", "k")  # same name, same key text: a new allocation of the new process
    new.check()
    old.release()
    assert alloc.freed == []
    new.release()
    assert alloc.freed == [("m_0", "k")]


def test_worker_allocator_sends_to_attached_workers_only() -> None:
    sent: list[list[str]] = []
    allocator = WorkerAllocator()
    allocator.attach("m_0", sent.append)
    allocator.free("m_0", "k")
    allocator.free("gone_0", "k")
    allocator.detach("m_0")
    allocator.free("m_0", "k2")
    assert sent == [["k"]]


class FakeRuntime(cuda_ipc._Runtime):
    """Counts the runtime calls cuda_ipc makes; a device 'allocation' is a base pointer per handle."""

    name = "fake"

    def __init__(self) -> None:
        self.opens = 0
        self.closes: list[int] = []
        self.devices: list[int] = []

    def device_count(self) -> int:
        return 2

    def set_device(self, device: int) -> None:
        self.devices.append(device)

    def get_device(self) -> int:
        return self.devices[-1] if self.devices else 0

    def init_context(self) -> None:
        pass

    def get_handle(self, ptr: int) -> bytes:
        return ptr.to_bytes(8, "little") * 8

    def open(self, handle: bytes) -> int:
        if handle == bytes(64):
            raise cuda_ipc.CudaIpcError("cudaIpcOpenMemHandle failed: invalid argument")
        self.opens += 1
        return 0x7F00_0000_0000 + self.opens * 0x1000_0000

    def close(self, ptr: int) -> None:
        self.closes.append(ptr)

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def address_range(self, ptr: int) -> tuple[int, int]:
        return ptr & ~0xFFFF, 0x10000


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    rt = FakeRuntime()
    monkeypatch.setattr(cuda_ipc, "_runtime", rt)
    monkeypatch.setattr(cuda_ipc, "_opened", {})
    monkeypatch.setattr(cuda_ipc, "_initialised", threading.local())
    return rt


def test_handle_opened_once_and_cached(fake_cuda: FakeRuntime) -> None:
    handle = bytes(range(64))
    first = cuda_ipc.open_handle(handle, 1)
    assert cuda_ipc.open_handle(handle, 1) == first
    assert fake_cuda.opens == 1 and cuda_ipc.opened_count() == 1
    assert cuda_ipc.open_handle(bytes(range(1, 65)), 1) != first
    assert fake_cuda.opens == 2
    cuda_ipc.close_handle(handle)
    assert fake_cuda.closes == [first] and cuda_ipc.opened_count() == 1
    cuda_ipc.close_handle(handle)  # not open: nothing
    assert fake_cuda.closes == [first]
    assert cuda_ipc.open_handle(handle, 1) != 0 and fake_cuda.opens == 3  # reopened after close


def test_handle_open_on_another_device_is_refused(fake_cuda: FakeRuntime) -> None:
    handle = bytes(range(64))
    cuda_ipc.open_handle(handle, 0)
    with pytest.raises(cuda_ipc.CudaIpcError, match="device 0, not 1"):
        cuda_ipc.open_handle(handle, 1)


def test_bad_handle_raises_and_is_not_cached(fake_cuda: FakeRuntime) -> None:
    with pytest.raises(cuda_ipc.CudaIpcError, match="invalid argument"):
        cuda_ipc.open_handle(bytes(64), 0)
    assert cuda_ipc.opened_count() == 0


def test_export_gives_allocation_handle_and_offset(fake_cuda: FakeRuntime) -> None:
    handle, offset = cuda_ipc.export(0x5_0000_1234, 0)
    assert offset == 0x1234 and handle == fake_cuda.get_handle(0x5_0000_0000)
    with pytest.raises(cuda_ipc.CudaIpcError, match="invalid CUDA device"):
        cuda_ipc.export(0x5_0000_1234, -1)


def test_calls_give_the_thread_its_device_back(fake_cuda: FakeRuntime) -> None:
    """A model on GPU 0 that opens a tensor made on GPU 1 keeps GPU 0 as its current device."""
    fake_cuda.set_device(0)
    cuda_ipc.open_handle(bytes(range(64)), 1)
    cuda_ipc.export(0x5_0000_1234, 1)
    assert fake_cuda.get_device() == 0 and 1 in fake_cuda.devices
