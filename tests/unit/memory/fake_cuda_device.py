"""A fake CUDA device behind memory.cuda_device.CudaDevice: allocations are host bytearrays at made-up
device addresses, IPC handles are 64-byte tokens. Only for the bookkeeping tests (the real one needs a GPU)."""

from __future__ import annotations

import itertools
import os

from inferd.supervisor.memory.cuda_device import CudaDeviceError


class FakeDevice:
    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus
        self.allocations: dict[bytes, tuple[int, int, bytearray]] = {}  # handle -> (device, base, memory)
        self.opened: dict[bytes, int] = {}  # handle -> times opened and not closed
        self.closed: list[bytes] = []
        self._bases = itertools.count(1)

    # the "client" side
    def allocate(self, nbytes: int, device: int = 0) -> bytes:
        handle = os.urandom(64)
        self.allocations[handle] = (device, next(self._bases) << 40, bytearray(nbytes))
        return handle

    def memory(self, handle: bytes) -> bytearray:
        return self.allocations[handle][2]

    # CudaDevice
    def device_count(self) -> int:
        return self.gpus

    def open(self, handle: bytes, device: int) -> int:
        if handle not in self.allocations:
            raise CudaDeviceError("cudaIpcOpenMemHandle: invalid resource handle")
        if self.allocations[handle][0] != device:
            raise CudaDeviceError("cudaIpcOpenMemHandle: the allocation is on another device")
        self.opened[handle] = self.opened.get(handle, 0) + 1
        return self.allocations[handle][1]

    def close(self, handle: bytes) -> None:
        self.opened[handle] -= 1
        if not self.opened[handle]:
            del self.opened[handle]
        self.closed.append(handle)

    def allocation_size(self, ptr: int, device: int) -> int | None:
        _, base, mem = self._find(ptr)
        return base + len(mem) - ptr

    def _find(self, ptr: int) -> tuple[int, int, bytearray]:
        for device, base, mem in self.allocations.values():
            if base <= ptr <= base + len(mem):
                return device, base, mem
        raise CudaDeviceError("an illegal memory access was encountered")

    def _span(self, ptr: int, nbytes: int) -> tuple[bytearray, int]:
        _, base, mem = self._find(ptr)
        if ptr + nbytes > base + len(mem):
            raise CudaDeviceError("an illegal memory access was encountered")
        return mem, ptr - base

    def to_host(self, dst: memoryview, src: int, device: int) -> None:
        mem, at = self._span(src, dst.nbytes)
        dst[:] = mem[at:at + dst.nbytes]

    def from_host(self, dst: int, src: memoryview, device: int) -> None:
        mem, at = self._span(dst, src.nbytes)
        mem[at:at + src.nbytes] = src

    def copy(self, dst: int, src: int, nbytes: int, device: int) -> None:
        smem, sat = self._span(src, nbytes)
        dmem, dat = self._span(dst, nbytes)
        dmem[dat:dat + nbytes] = smem[sat:sat + nbytes]
