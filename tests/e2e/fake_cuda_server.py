"""`inferd` with a fake CUDA device, for the CUDA shared-memory data path on a machine without a GPU.

The fake's "device memory" is POSIX shared memory: a handle is b"FAKECUDA", the device id and a /dev/shm
name, padded to 64 bytes, and "device pointers" are the addresses of the supervisor's mapping of it. It
stands in for memory.cuda_device.IpcDevice only (the small interface the region bookkeeping uses), so
the HTTP/gRPC parsing, the region table, pins, host copies for CPU models and output writes are the real
code. Run as: python fake_cuda_server.py <inferd arguments>.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

MAGIC = b"FAKECUDA"
GPUS = 2


def fake_handle(shm_name: str, device: int = 0) -> bytes:
    raw = MAGIC + bytes([device]) + shm_name.lstrip("/").encode()
    assert len(raw) <= 64
    return raw.ljust(64, b"\0")


class ShmBackedDevice:
    def __init__(self) -> None:
        self._maps: dict[bytes, tuple[mmap.mmap, Any, int, int]] = {}  # handle -> (map, anchor, base, size)

    def device_count(self) -> int:
        return GPUS

    def open(self, handle: bytes, device: int) -> int:
        from inferd.supervisor.memory.cuda_device import CudaDeviceError

        if handle in self._maps:
            return self._maps[handle][2]
        if not handle.startswith(MAGIC):
            raise CudaDeviceError("cudaIpcOpenMemHandle: invalid resource handle")
        if handle[len(MAGIC)] != device:
            raise CudaDeviceError("cudaIpcOpenMemHandle: the allocation is on another device")
        name = handle[len(MAGIC) + 1:].rstrip(b"\0").decode()
        try:
            fd = os.open("/dev/shm/" + name, os.O_RDWR)
        except OSError as exc:
            raise CudaDeviceError(f"cudaIpcOpenMemHandle: invalid resource handle ({exc.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        anchor = (ctypes.c_char * size).from_buffer(mm)
        base = ctypes.addressof(anchor)
        self._maps[handle] = (mm, anchor, base, size)
        return base

    def close(self, handle: bytes) -> None:
        mm, anchor, _, _ = self._maps.pop(handle)
        del anchor
        mm.close()

    def _check(self, ptr: int, nbytes: int) -> None:
        from inferd.supervisor.memory.cuda_device import CudaDeviceError

        for _, _, base, size in self._maps.values():
            if base <= ptr and ptr + nbytes <= base + size:
                return
        raise CudaDeviceError("an illegal memory access was encountered")

    def allocation_size(self, ptr: int, device: int) -> int | None:
        for _, _, base, size in self._maps.values():
            if base <= ptr <= base + size:
                return base + size - ptr
        return None

    def to_host(self, dst: memoryview, src: int, device: int) -> None:
        self._check(src, dst.nbytes)
        ctypes.memmove((ctypes.c_char * dst.nbytes).from_buffer(dst), src, dst.nbytes)

    def from_host(self, dst: int, src: memoryview, device: int) -> None:
        self._check(dst, src.nbytes)
        ctypes.memmove(dst, bytes(src), src.nbytes)

    def copy(self, dst: int, src: int, nbytes: int, device: int) -> None:
        self._check(src, nbytes)
        self._check(dst, nbytes)
        ctypes.memmove(dst, src, nbytes)


if __name__ == "__main__":
    from inferd.supervisor.main import main
    from inferd.supervisor.memory import client_shm

    client_shm.IpcDevice = ShmBackedDevice  # type: ignore[misc,assignment]
    client_shm.probe = lambda: True
    sys.exit(main(sys.argv[1:]))
