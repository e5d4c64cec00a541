"""A stand-in for the CUDA runtime in worker processes, for CPU tests of the device data path.

"Device memory" is a POSIX shared-memory file mapped into the process; its IPC handle is the file's
name; opening a handle maps the file in the opening process; copies are memmove. Everything else --
pb_utils, the worker runtime, the supervisor's bookkeeping, the wire -- is the real code. A test
model installs it in `initialize` (`fake_cuda.install()`), which replaces only the runtime object
inside `inferd.worker.wire.cuda_ipc`.

An allocation's file is unlinked when the array that owns it is garbage collected in its producer,
so a test sees leaks and releases as files left in /dev/shm (`fakecuda_<pid>_<n>`).
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import weakref
from typing import Any

import numpy as np
from inferd.worker.wire import cuda_ipc

PREFIX = "fakecuda_"


class ShmCuda(cuda_ipc._Runtime):
    name = "fake (shared memory)"

    def __init__(self) -> None:
        self.maps: dict[int, tuple[mmap.mmap, int, str]] = {}  # base pointer -> (mapping, size, file name)
        self._ids = itertools.count(1)

    def device_count(self) -> int:
        return 1

    def set_device(self, device: int) -> None:
        if device != 0:
            raise cuda_ipc.CudaIpcError("cudaSetDevice(%d) failed: invalid device ordinal" % device)

    def init_context(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def _map(self, name: str, size: int, create: bool) -> int:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open("/dev/shm/" + name, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        self.maps[base] = (mapping, size, name)
        return base

    def alloc(self, nbytes: int) -> tuple[int, str]:
        name = "%s%d_%d" % (PREFIX, os.getpid(), next(self._ids))
        return self._map(name, max(nbytes, 1), True), name

    def address_range(self, ptr: int) -> tuple[int, int]:
        for base, (_, size, _) in self.maps.items():
            if base <= ptr < base + size:
                return base, size
        raise cuda_ipc.CudaIpcError("cuMemGetAddressRange failed: not an allocation")

    def get_handle(self, ptr: int) -> bytes:
        return self.maps[ptr][2].encode().ljust(cuda_ipc.HANDLE_BYTES, b"\0")

    def open(self, handle: bytes) -> int:
        name = handle.rstrip(b"\0").decode(errors="replace")
        if name.startswith("%s%d_" % (PREFIX, os.getpid())):  # as CUDA: a process cannot open its own handle
            raise cuda_ipc.CudaIpcError("cudaIpcOpenMemHandle failed: invalid device context")
        try:
            return self._map(name, 0, False)
        except (OSError, UnicodeDecodeError) as exc:
            raise cuda_ipc.CudaIpcError("cudaIpcOpenMemHandle failed: %s" % exc) from None

    def close(self, ptr: int) -> None:
        pass  # views may still exist; the mapping goes with the process

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)


class FakeGpuArray:
    """What a cupy array on GPU 0 looks like to pb_utils: `__cuda_array_interface__` and `.device.id`."""

    def __init__(self, rt: ShmCuda, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self.ptr, name = rt.alloc(host.nbytes)
        ctypes.memmove(self.ptr, host.ctypes.data, host.nbytes)
        self.device = type("Device", (), {"id": 0})()
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (self.ptr, False),
                                         "strides": None, "version": 2}
        weakref.finalize(self, _unlink, name)


def _unlink(name: str) -> None:
    try:
        os.unlink("/dev/shm/" + name)
    except FileNotFoundError:
        pass


def install() -> ShmCuda:
    from inferd.worker import bls

    rt = ShmCuda()
    cuda_ipc._runtime = rt
    bls._device_capable = True  # this worker can open device tensors now (it has no /dev/nvidiactl)
    return rt


def to_host(pb_tensor: Any) -> np.ndarray:
    """A device pb_utils.Tensor's bytes copied to the host (what to_dlpack + .cpu() does on a GPU)."""
    return pb_tensor._array.to_numpy()


def leftover(pid: int | None = None) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX + ("%d_" % pid if pid else "")))
