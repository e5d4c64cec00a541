"""CUDA shared-memory region bookkeeping (memory.cuda_regions, through memory.client_shm) on a fake device:
registration checks, status, offsets and sizes, unregister while requests use a region, the client's
process exiting, and how a pinned input reaches a GPU worker (loc="cuda") or a CPU one (host bytes)."""

from __future__ import annotations

import gc

import pytest
from inferd.supervisor.inference.types import InferRequest, Tensor
from inferd.supervisor.instances.packing import InputPacker
from inferd.supervisor.memory.client_shm import ClientShm
from inferd.supervisor.memory.cuda_device import CudaDeviceError
from inferd.supervisor.memory.cuda_regions import TRITON_INVALID, CudaRegions, CudaSpan
from inferd.worker.wire import messages as m
from inferd.worker.wire.errors import ErrorCode, InferdError

from .fake_cuda_device import FakeDevice

MiB = 1 << 20


@pytest.fixture
def dev() -> FakeDevice:
    return FakeDevice(gpus=2)


@pytest.fixture
def shm(dev: FakeDevice) -> ClientShm:
    return ClientShm(cuda=CudaRegions(lambda: dev), cuda_probe=True)


def _error(fn, *args, **kwargs) -> InferdError:
    with pytest.raises(InferdError) as info:
        fn(*args, **kwargs)
    return info.value


def test_register_status_unregister(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(4096)
    shm.register("cuda", "r1", raw_handle=h, device_id=0, byte_size=4096)
    assert shm.status("cuda") == [{"name": "r1", "device_id": 0, "byte_size": 4096}]
    assert shm.status("cuda", "r1") == [{"name": "r1", "device_id": 0, "byte_size": 4096}]
    assert shm.status("system") == []
    err = _error(shm.status, "cuda", "nope")
    assert err.code == ErrorCode.NOT_FOUND and err.message == "Unable to find cuda shared memory region: 'nope'"
    err = _error(shm.register, "cuda", "r1", raw_handle=h, device_id=0, byte_size=16)
    assert err.code == ErrorCode.ALREADY_EXISTS and err.message == "shared memory region 'r1' already in manager"
    assert dev.opened == {h: 1}
    shm.unregister("cuda", "r1")
    assert shm.status("cuda") == [] and dev.opened == {} and dev.closed == [h]
    shm.unregister("cuda", "r1")  # unknown: fine, as Triton


def test_registration_refuses_bad_handles_devices_and_sizes(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(1024, device=1)
    cases = [
        (dict(raw_handle=b"\0" * 64, device_id=1, byte_size=8), "cannot open the CUDA IPC handle on device 1"),
        (dict(raw_handle=b"abc", device_id=1, byte_size=8), "64-byte cudaIpcMemHandle_t"),
        (dict(raw_handle=h, device_id=2, byte_size=8), "device_id 2 is not a GPU of this server (it has 2)"),
        (dict(raw_handle=h, device_id=0, byte_size=8), "cannot open the CUDA IPC handle on device 0"),
    ]
    for fields, reason in cases:
        err = _error(shm.register, "cuda", "r", **fields)
        assert err.code == ErrorCode.INVALID_ARG
        assert err.message.startswith(TRITON_INVALID) and reason in err.message, err.message
    err = _error(shm.register, "cuda", "r", raw_handle=h, device_id=1, byte_size=1025)
    assert err.message == ("failed to register shared memory region 'r': invalid args: byte_size 1025 exceeds "
                           "the allocation's 1024 bytes")
    err = _error(shm.register, "cuda", "r", raw_handle=h, device_id=1, byte_size=0)
    assert "byte_size must be positive" in err.message
    assert shm.status("cuda") == [] and dev.opened == {}  # nothing left open by a refusal


def test_without_cuda_every_registration_gets_tritons_answer() -> None:
    def no_cuda() -> FakeDevice:
        raise CudaDeviceError("no CUDA runtime or no GPU usable by the server")

    shm = ClientShm(cuda=CudaRegions(no_cuda), cuda_probe=False)
    assert not shm.cuda_available
    for name in ("r", ""):
        err = _error(shm.register, "cuda", name, raw_handle=b"\0" * 64, device_id=0, byte_size=16)
        assert (err.code, err.message) == (ErrorCode.INVALID_ARG, TRITON_INVALID)
    assert shm.status("cuda") == []
    shm.unregister("cuda", "r")
    shm.unregister("cuda")


def test_offsets_and_sizes_out_of_range_name_the_region(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(256)
    shm.register("cuda", "in", raw_handle=h, device_id=0, byte_size=128)  # a window smaller than the allocation
    assert _error(shm.read, "in", 128, 1).message == "Invalid offset for shared memory region: 'in'"
    assert _error(shm.read, "in", 64, 65).message == "Invalid offset + byte size for shared memory region: 'in'"
    assert _error(shm.write, "in", 100, b"x" * 29).message == \
        "Invalid offset + byte size for shared memory region: 'in'"
    assert _error(shm.read, "gone", 0, 4).message == "Unable to find shared memory region: 'gone'"
    dev.memory(h)[:128] = bytes(range(128))
    assert bytes(shm.read("in", 60, 4)) == bytes([60, 61, 62, 63])  # a host copy
    shm.write("in", 8, b"\xff\xfe")
    assert dev.memory(h)[8:10] == b"\xff\xfe"


def test_device_input_is_a_pinned_span_and_output_copies_device_to_device(shm: ClientShm, dev: FakeDevice) -> None:
    hi, ho = dev.allocate(64), dev.allocate(64)
    shm.register("cuda", "in", raw_handle=hi, device_id=0, byte_size=64)
    shm.register("cuda", "out", raw_handle=ho, device_id=0, byte_size=64)
    dev.memory(hi)[:] = bytes(range(64))
    span = shm.read("in", 16, 32, device_ok=True)
    assert type(span) is CudaSpan and (span.offset, span.nbytes, span.owner) == (16, 32, "client:in")
    shm.write("out", 0, span)  # echo of a device input: D2D
    assert dev.memory(ho)[:32] == bytes(range(16, 48))
    assert bytes(span.to_host()) == bytes(range(16, 48))


def test_unregister_while_in_use_finishes_the_request_and_closes_after(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(64)
    shm.register("cuda", "r", raw_handle=h, device_id=0, byte_size=64)
    dev.memory(h)[:4] = b"abcd"
    span = shm.read("r", 0, 4, device_ok=True)
    shm.unregister("cuda")  # while a request holds an input in it
    assert shm.status("cuda") == []
    assert dev.opened == {h: 1}, "the mapping stays while the request uses it"
    assert bytes(span.to_host()) == b"abcd"
    assert _error(shm.read, "r", 0, 4).message == "Unable to find shared memory region: 'r'"
    assert _error(shm.write, "r", 0, b"zz").message == "Unable to find shared memory region: 'r'"
    shm.register("cuda", "r", raw_handle=dev.allocate(8), device_id=0, byte_size=8)  # the name is free again
    del span
    gc.collect()
    assert h not in dev.opened and h in dev.closed


def test_one_handle_in_two_regions_is_opened_once(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(64)
    shm.register("cuda", "a", raw_handle=h, device_id=0, byte_size=64)
    shm.register("cuda", "b", raw_handle=h, device_id=0, byte_size=32)
    assert dev.opened[h] == 1
    shm.unregister("cuda", "a")
    assert dev.opened[h] == 1 and shm.cuda.is_open(h)
    shm.unregister("cuda", "b")
    assert h not in dev.opened and not shm.cuda.is_open(h)


def test_client_exit_leaves_the_region_usable_until_unregistered(shm: ClientShm, dev: FakeDevice) -> None:
    # CUDA IPC keeps an allocation alive while any process maps it: the fake keeps the bytes, as the driver
    h = dev.allocate(16)
    shm.register("cuda", "orphan", raw_handle=h, device_id=0, byte_size=16)
    dev.memory(h)[:] = b"0123456789abcdef"
    # ... the client process exits here; nothing tells the server ...
    assert bytes(shm.read("orphan", 4, 4)) == b"4567"
    shm.unregister("cuda", "orphan")
    assert h in dev.closed and not dev.opened


def test_system_and_cuda_names_share_one_namespace(shm: ClientShm, dev: FakeDevice, tmp_path) -> None:
    shm.register("cuda", "x", raw_handle=dev.allocate(8), device_id=0, byte_size=8)
    err = _error(shm.register, "system", "x", key="/whatever", offset=0, byte_size=8)
    assert err.code == ErrorCode.ALREADY_EXISTS


def _request(span: CudaSpan) -> InferRequest:
    return InferRequest("m", inputs=[Tensor("IN", "FP32", [span.nbytes // 4], span)])


def test_gpu_worker_gets_a_cuda_ref_and_later_forgets_the_handle(shm: ClientShm, dev: FakeDevice) -> None:
    h = dev.allocate(2 * MiB)
    shm.register("cuda", "big", raw_handle=h, device_id=0, byte_size=2 * MiB)
    packer = InputPacker(pool=None, device=0)
    span = shm.read("big", MiB, MiB, device_ok=True)
    packed = packer.pack([_request(span)])
    assert packed.frames == [] and packed.leases == []
    (ref,) = packed.items[0]["inputs"]
    assert ref == {"name": "IN", "datatype": "FP32", "shape": [MiB // 4], "loc": "cuda", "frame": -1,
                   "region": h.hex(), "offset": MiB, "nbytes": MiB, "device": 0, "owner": "client:big"}
    del span, packed
    gc.collect()
    shm.unregister("cuda", "big")
    assert packer.pack([InferRequest("m")]).forget == ["cuda:" + h.hex()]
    assert packer.pack([InferRequest("m")]).forget == []


@pytest.mark.parametrize("worker_device", [None, 1])  # a CPU instance, an instance on another GPU
def test_other_workers_get_host_bytes(shm: ClientShm, dev: FakeDevice, worker_device: int | None) -> None:
    h = dev.allocate(64)
    shm.register("cuda", "small", raw_handle=h, device_id=0, byte_size=64)
    dev.memory(h)[:] = bytes(range(64))
    packed = InputPacker(pool=None, device=worker_device).pack([_request(shm.read("small", 0, 64, device_ok=True))])
    (ref,) = packed.items[0]["inputs"]
    assert ref.get("loc", "frame") == "frame" and ref["nbytes"] == 64
    assert m.INLINE_MAX_BYTES > 64 and bytes(packed.frames[ref["frame"]]) == bytes(range(64))


class _Allocator:
    def __init__(self) -> None:
        self.freed: list[tuple[str, str]] = []

    def free(self, owner: str, key: str) -> None:
        self.freed.append((owner, key))


def test_a_workers_device_output_is_copied_device_to_device(shm: ClientShm, dev: FakeDevice) -> None:
    from inferd.supervisor.memory.device_refs import DeviceRef, DeviceRefs

    client = dev.allocate(64)
    producer = dev.allocate(4096)  # a GPU worker's pool segment
    dev.memory(producer)[1000:1016] = b"device-output-16"
    shm.register("cuda", "out", raw_handle=client, device_id=0, byte_size=64)
    table = DeviceRefs(_Allocator())
    ref = DeviceRef(table.register("ident_gpu_0", "k", label="ident_gpu_0"), producer.hex(), 1000, 16, 0)
    shm.write("out", 8, ref)
    assert dev.memory(client)[8:24] == b"device-output-16"
    assert producer not in dev.opened and producer in dev.closed, "the producer's segment is mapped only to copy"
    assert _error(shm.write, "out", 56, ref).message == "Invalid offset + byte size for shared memory region: 'out'"


def test_an_output_from_a_dead_producer_is_an_error(shm: ClientShm, dev: FakeDevice) -> None:
    from inferd.supervisor.memory.device_refs import DeviceRef, DeviceRefs

    client = dev.allocate(64)
    shm.register("cuda", "out", raw_handle=client, device_id=0, byte_size=64)
    table = DeviceRefs(_Allocator())
    ref = DeviceRef(table.register("w", "k", label="ident_gpu_0"), dev.allocate(64).hex(), 0, 16, 0)
    table.producer_died("w")
    err = _error(shm.write, "out", 0, ref)
    assert err.code == ErrorCode.UNAVAILABLE and "'ident_gpu_0'" in err.message


def test_a_device_output_for_a_region_gone_meanwhile_is_a_clear_error(shm: ClientShm, dev: FakeDevice) -> None:
    from inferd.supervisor.memory.device_refs import DeviceRef, DeviceRefs

    ref = DeviceRef(DeviceRefs(_Allocator()).register("w", "k"), dev.allocate(64).hex(), 0, 16, 0)
    err = _error(shm.write, "out", 0, ref)
    assert (err.code, err.message) == (ErrorCode.INVALID_ARG, "Unable to find shared memory region: 'out'")


def test_which_models_take_client_inputs_on_the_device() -> None:
    from inferd.supervisor.core.models import ModelVersion

    def mv(**cfg) -> ModelVersion:
        return ModelVersion("m", 1, cfg, "", None, [], None, None)  # type: ignore[arg-type]

    gpu = [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]
    on_device = {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}}
    assert mv(backend="python", parameters=on_device, instance_group=gpu).device_inputs
    assert mv(backend="pytorch", instance_group=gpu).device_inputs
    assert not mv(backend="python", instance_group=gpu).device_inputs  # the default "yes": host tensors
    assert not mv(backend="onnxruntime", instance_group=gpu).device_inputs
    assert not mv(backend="pytorch", instance_group=[{"kind": "KIND_CPU", "count": 1}]).device_inputs
    assert not mv(backend="pytorch", instance_group=gpu, sequence_batching={}).device_inputs
    cached = mv(backend="pytorch", instance_group=gpu)
    cached.cache_generation = 3
    assert not cached.device_inputs
    shaped = mv(backend="pytorch", instance_group=gpu, input=[{"name": "S", "is_shape_tensor": True}, {"name": "X"}])
    assert shaped.device_inputs and shaped.host_only_inputs == frozenset({"S"})
