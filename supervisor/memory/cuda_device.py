"""The few CUDA operations the supervisor needs for clients' CUDA shared-memory regions, behind one small
interface (`CudaDevice`) so the region bookkeeping is tested on a CPU with a fake device.

`IpcDevice` is the real one, over `inferd.worker.wire.cuda_ipc` (the shared CUDA-IPC helpers, which import
their CUDA library lazily). Nothing here imports a CUDA library at module level: `IpcDevice()` is built on
the first CUDA registration, and `probe()` (the start-up check behind the `cuda_shared_memory` extension)
only looks at files.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
from typing import Any, Protocol

import numpy as np

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaDeviceError(Exception):
    """A CUDA operation failed (bad or foreign handle, wrong device, no CUDA); the message says why."""


class CudaDevice(Protocol):
    def device_count(self) -> int: ...

    def open(self, handle: bytes, device: int) -> int:
        """The base device pointer of the allocation `handle` exports (opened once per handle)."""

    def close(self, handle: bytes) -> None: ...

    def allocation_size(self, ptr: int, device: int) -> int | None:
        """Bytes from `ptr` to the end of its allocation; None when the driver cannot say."""

    def to_host(self, dst: memoryview, src: int, device: int) -> None:
        """Copy len(dst) bytes of device memory at `src` into the writable host buffer `dst`."""

    def from_host(self, dst: int, src: memoryview, device: int) -> None:
        """Copy the host buffer `src` to device memory at `dst`."""

    def copy(self, dst: int, src: int, nbytes: int, device: int) -> None:
        """Device to device."""


def probe() -> bool:
    """Whether CUDA shared memory can work here, judged without importing a CUDA library: an NVIDIA
    device node and a CUDA Python binding installed. Registration still checks for real."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return False
    return any(_has_module(name) for name in ("cuda.bindings", "cupy", "torch"))


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _host_ptr(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if buf.nbytes else 0


class IpcDevice:
    """CudaDevice over wire.cuda_ipc; CudaDeviceError when CUDA or a GPU is missing."""

    def __init__(self) -> None:
        try:
            from inferd.worker.wire import cuda_ipc
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise CudaDeviceError(f"CUDA IPC support is not installed ({exc})") from None
        self._ipc: Any = cuda_ipc
        if not cuda_ipc.available():
            raise CudaDeviceError("no CUDA runtime or no GPU usable by the server")
        self._count = int(cuda_ipc.device_count())

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._ipc.CudaIpcError as exc:
            raise CudaDeviceError(str(exc)) from None

    def device_count(self) -> int:
        return self._count

    def open(self, handle: bytes, device: int) -> int:
        return int(self._call(self._ipc.open_handle, handle, device))

    def close(self, handle: bytes) -> None:
        self._call(self._ipc.close_handle, handle)

    def allocation_size(self, ptr: int, device: int) -> int | None:
        # cuMemGetAddressRange through the driver library itself: the allocation's true extent, so a
        # registered byte_size can never reach past it (an illegal address would poison the context)
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuMemGetAddressRange_v2
        except (OSError, AttributeError):
            return None
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        fn.restype = ctypes.c_int
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        if fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None
        return int(base.value) + int(size.value) - ptr

    def to_host(self, dst: memoryview, src: int, device: int) -> None:
        if dst.nbytes:
            self._call(self._ipc.copy, _host_ptr(dst), src, dst.nbytes, device)

    def from_host(self, dst: int, src: memoryview, device: int) -> None:
        if src.nbytes:
            self._call(self._ipc.copy, dst, _host_ptr(src), src.nbytes, device)

    def copy(self, dst: int, src: int, nbytes: int, device: int) -> None:
        if nbytes:
            self._call(self._ipc.copy, dst, src, nbytes, device)
